"""SGLang's RadixCache call shapes over hicache, for porting SGLang's own unit tests.

Only the shapes are translated: SGLang (0.5.9) passes ``InsertParams``/``MatchPrefixParams``/
``EvictParams`` objects and gets ``InsertResult``/``EvictResult`` back, and builds a cache
without pools with ``RadixCache.create_simulated``; hicache takes keywords and returns ints.
Everything else (``RadixKey``, ``TreeNode``, ``MatchResult``, the other methods) is hicache's
own object, reached unchanged through the wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.radix import MatchResult, RadixCache, RadixKey, TreeNode


@dataclass
class InsertParams:
    key: RadixKey
    value: torch.Tensor | None = None
    priority: int = 0


@dataclass
class InsertResult:
    prefix_len: int


@dataclass
class MatchPrefixParams:
    key: RadixKey


@dataclass
class EvictParams:
    num_tokens: int


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0


class SGLangShapedCache:
    """A hicache ``RadixCache`` taking and returning SGLang's parameter objects."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache

    def insert(self, params: InsertParams) -> InsertResult:
        return InsertResult(self.cache.insert(params.key, params.value, priority=params.priority))

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        return self.cache.match_prefix(params.key)

    def evict(self, params: EvictParams) -> EvictResult:
        return EvictResult(self.cache.evict(params.num_tokens))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)


def create_simulated(
    disable: bool = False,
    mock_allocator: Any = None,
    page_size: int = 1,
    enable_kv_cache_events: bool = False,
) -> SGLangShapedCache:
    """SGLang's ``RadixCache.create_simulated``: no request pool, an optional test-double
    allocator (evicted slots are freed to it)."""
    cache = RadixCache(
        None,
        mock_allocator,
        page_size,
        disable=disable,
        enable_kv_cache_events=enable_kv_cache_events,
    )
    return SGLangShapedCache(cache)


def child(node: TreeNode, first_page: list[int]) -> TreeNode | None:
    """The child of ``node`` whose key starts with ``first_page`` (SGLang's tests look children
    up by a tuple of token ids; hicache keys them by the page's bytes, an internal detail)."""
    return next(
        (c for c in node.children.values() if c.key[: len(first_page)].tolist() == first_page),
        None,
    )


def available_and_evictable_str(cache: SGLangShapedCache) -> str:
    """SGLang's ``mem_cache.common.available_and_evictable_str``."""
    return cache.available_and_evictable_str()

"""No prefix holes: a transient write failure at any page of a chain, with several chains in
flight, leaves storage holding only prefixes of each chain (never a page whose parent page is
missing), and once the fault clears, the next backup on each chain stores all of it."""

from __future__ import annotations

import errno
import os
import random
import threading
from typing import Any

import pytest
import torch

from hicache import KVStack
from hicache.backends import file_lru
from hicache.backends.file import HiCacheFile
from hicache.backends.memory import MemoryStorage
from hicache.backends.pages import PageIO
from hicache.radix import RadixKey
from hicache.radix.page_hash import namespace_seed, page_hashes
from tests.radix.storage_helpers import PAGE, fill, make_stack, storage_config
from tests.storage.conftest import keys_for, make_host, slots

CHAINS = 3
PAGES = 6  # per chain


class FlakyStorage(MemoryStorage):
    """A memory store whose writes wait for ``gate`` and fail, from the first key in
    ``failing`` on, for the rest of the batch (the write stops there, as the file store's)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.failing: set[str] = set()

    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        self.gate.wait(10)
        bad = next((i for i, key in enumerate(keys) if key in self.failing), len(keys))
        done = super()._write_pages(pages, keys[:bad], slots[:bad])
        return done + [False] * (len(keys) - bad)

    def stored(self, keys: list[str]) -> list[bool]:
        return [bool(self.batch_exists([key])) for key in keys]


def _chain(seed: int, pages: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(pages * PAGE)]


def _keys(stack: KVStack, ids: list[int]) -> list[str]:
    tier = stack.cache.storage_tier
    assert tier is not None
    return tier.keys.page_keys(page_hashes(RadixKey(ids).token_ids, PAGE, namespace_seed(None)))


def _insert(stack: KVStack, ids: list[int], seed: int) -> None:
    """Insert ``ids``: the device prefix the tree has, random KV for the rest."""
    m = stack.cache.match_prefix(RadixKey(ids))
    slots = stack.allocator.alloc(len(ids) - len(m.device_indices))
    assert slots is not None
    fill(stack, slots, seed)
    stack.cache.insert(RadixKey(ids), torch.cat([m.device_indices, slots]))


def _insert_in_steps(stack: KVStack, ids: list[int], node_pages: int, seed: int) -> None:
    """Insert ``ids`` one node of ``node_pages`` pages at a time (a chain of nodes)."""
    for end in range(node_pages * PAGE, len(ids) + 1, node_pages * PAGE):
        _insert(stack, ids[:end], seed + end)


def _assert_prefixes(backend: FlakyStorage, chains: list[list[str]]) -> None:
    for keys in chains:
        stored = backend.stored(keys)
        head = stored.index(False) if False in stored else len(stored)
        assert not any(stored[head:]), f"a hole: stored {stored}"


@pytest.mark.parametrize("node_pages", [1, 2])
@pytest.mark.parametrize("position", range(PAGES))
def test_failed_backup_cancels_the_chain_below_it(position, node_pages):
    backend = FlakyStorage()
    stack = make_stack(storage_config(backend), size=512)
    cache = stack.cache
    chains = [_chain(seed, PAGES) for seed in range(CHAINS)]
    keys = [_keys(stack, ids) for ids in chains]
    for c, chain_keys in enumerate(keys):  # chain c fails at page position + c
        backend.failing.add(chain_keys[(position + c) % PAGES])
    for c, ids in enumerate(chains):
        _insert_in_steps(stack, ids, node_pages, seed=100 * c)
    cache.host_tier.drain()  # every node's backup queued, none written yet
    backend.gate.set()
    cache.drain_transfers()
    _assert_prefixes(backend, keys)
    for c, chain_keys in enumerate(keys):
        assert not any(backend.stored(chain_keys)[(position + c) % PAGES :])
    assert cache.stats().storage.pending_backups == 0
    backend.failing.clear()  # the fault clears; the next turn of each chain backs it up
    longer = [ids + _chain(50 + c, 1) for c, ids in enumerate(chains)]
    for c, ids in enumerate(longer):
        _insert(stack, ids, seed=200 + c)
    cache.drain_transfers()
    assert all(all(backend.stored(_keys(stack, ids))) for ids in longer)
    cache.check_invariants()


def test_a_file_write_failure_stops_the_batch(tmp_path, monkeypatch):
    host = make_host("mha", "page_first")
    store = HiCacheFile(root=str(tmp_path / "store"))
    store.register_mem_pool_host(host)
    keys = keys_for(host, 4)

    real_open = os.open

    def flaky_open(path: str, flags: int, *args: Any, **kw: Any) -> Any:
        if keys[1] in path and flags & os.O_CREAT:  # the fault: EIO creating page 2's file
            raise OSError(errno.EIO, "injected")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(file_lru.os, "open", flaky_open)
    assert store.batch_set_v1(keys, slots([0, 1, 2, 3])) == [True, False, False, False]
    assert [store.batch_exists([key]) for key in keys] == [1, 0, 0, 0]  # no page past the hole

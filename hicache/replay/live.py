"""A request during a replay: the fields the cache's request protocol reads, and its record."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hicache.replay.trace import TraceRequest, prompt_tokens

_NO_SLOTS = torch.empty(0, dtype=torch.int64)  # never written: the cache replaces, not fills


@dataclass(frozen=True)
class Record:
    """What one request measured. Times are modelled seconds since the trace's start."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    device_hit: int
    host_hit: int
    computed: int
    ideal_hit: int
    first_token_s: float | None
    finish_s: float | None
    error: str | None = None
    storage_hit: int = 0
    admitted_s: float | None = None

    @property
    def wait_s(self) -> float | None:
        """Modelled time from arrival to admission (the queue), None when never admitted."""
        return None if self.admitted_s is None else self.admitted_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(eq=False)
class LiveRequest:
    """A trace request being replayed; duck-types ``hicache.radix.Req``.

    ``origin_input_ids`` is the prompt (read-only int32 numpy), built when the request is first
    considered for admission and dropped when it finishes. Decode tokens get KV slots (so they
    take device memory while the request runs) but are not inserted into the tree: the trace's
    next turns carry them as new hash ids anyway. ``kv_len`` stays at the prompt length.
    """

    rid: int
    trace: TraceRequest
    arrival_s: float
    ideal_hit: int
    block_tokens: int
    output_ids: list[int] = field(default_factory=list)
    extra_key: Hashable | None = None
    priority: int = 0
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: _NO_SLOTS)
    last_node: Any = None
    cache_protected_len: int = 0
    kv_len: int = 0
    kv_capacity: int = 0
    to_compute: int = 0
    decode_left: int = 0
    device_hit: int = 0
    host_hit: int = 0
    storage_hit: int = 0  # tokens a storage prefetch added and admission loaded back
    prefetched: bool = False  # storage was asked (once per request)
    mamba_branching_seqlen: int | None = None  # a hybrid match's branch point (a chunk ends there)
    admitted_s: float | None = None
    first_token_s: float | None = None
    _tokens: np.ndarray | None = None

    @property
    def origin_input_ids(self) -> np.ndarray:
        if self._tokens is None:
            t = self.trace
            self._tokens = prompt_tokens(t.hash_ids, t.input_length, self.block_tokens)
        return self._tokens

    @property
    def kv_total(self) -> int:
        """Tokens with KV over the request's life (the last generated token never has any)."""
        return self.trace.input_length + max(self.trace.output_length - 1, 0)

    def release(self) -> None:
        """Drop what a finished request no longer needs: its prompt and its slots (the whole
        prompt's after ``cache_unfinished_req``: 8 bytes a token, kept by every finished request
        otherwise)."""
        self._tokens = None
        self.prefix_indices = _NO_SLOTS

    def record(self, finish_s: float | None, error: str | None = None) -> Record:
        t = self.trace
        hit = self.device_hit + self.host_hit + self.storage_hit
        return Record(
            rid=self.rid,
            arrival_s=self.arrival_s,
            prompt_tokens=t.input_length,
            output_tokens=t.output_length if error is None else 0,
            device_hit=self.device_hit,
            host_hit=self.host_hit,
            computed=t.input_length - hit if error is None else 0,
            ideal_hit=self.ideal_hit,
            first_token_s=self.first_token_s,
            finish_s=finish_s,
            error=error,
            storage_hit=self.storage_hit,
            admitted_s=self.admitted_s,
        )

"""A generation request: its tokens, its row of KV slots and the cache bookkeeping on it."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.radix.tokens import RequestTokens, TokenBuffer


class Status(enum.Enum):
    WAITING = "waiting"  # queued; holds nothing
    PREFILL = "prefill"  # admitted; prompt KV being computed chunk by chunk
    DECODE = "decode"  # prompt done; one token per step
    FINISHED = "finished"  # KV handed to the cache, row freed
    REJECTED = "rejected"  # can never fit; ``error`` says why, holds nothing


@dataclass(eq=False)
class Request:
    """One request, as the engine and the radix cache see it.

    It has the attributes of ``hicache.radix.Req`` that ``cache_unfinished_req`` /
    ``cache_finished_req`` read and update: ``origin_input_ids``, ``output_ids``, ``kv_len``,
    ``req_pool_idx``, ``extra_key``, ``priority``, ``prefix_indices``, ``last_node`` and
    ``cache_protected_len``.

    Attributes
    ----------
    tokens : the request's ``origin_input_ids + output_ids`` as a ``TokenBuffer``, the prompt
        converted once at construction and each generated token once, when first read after
        it was appended (``output_ids`` only grows; a replaced list is converted anew); its
        keys are views (no list conversion).
    kv_len : tokens whose KV is in row ``req_pool_idx`` (positions ``0 .. kv_len - 1``).
    kv_capacity : slots the row names (``>= kv_len``; the tail of the last page may be unused).
    device_hit, host_hit, computed : prompt tokens served from L1, loaded back from L2, and
        computed by the model.
    logits : fp32 ``[vocab]`` next-token logits of each generated token, on the model device
        (kept only when the engine records them).
    arrival, first_token_time, finish_time : ``time.perf_counter()`` stamps (seconds).
    """

    rid: int
    origin_input_ids: list[int]
    max_new_tokens: int
    extra_key: Hashable | None = None
    priority: int = 0
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    cache_protected_len: int = 0
    last_node: Any = None
    last_host_node: Any = None
    host_hit_length: int = 0
    status: Status = Status.WAITING
    error: str | None = None
    kv_len: int = 0
    kv_capacity: int = 0
    device_hit: int = 0
    host_hit: int = 0
    computed: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    arrival: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    _tokens: RequestTokens = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._tokens = RequestTokens(self.origin_input_ids, self.output_ids, self.max_new_tokens)

    @property
    def tokens(self) -> TokenBuffer:
        """The request's tokens; catches up with the tokens appended to ``output_ids``."""
        return self._tokens.get(self.origin_input_ids, self.output_ids)

    @property
    def kv_total(self) -> int:
        """Tokens that get KV over the request's life (the last sampled token never does)."""
        return len(self.origin_input_ids) + self.max_new_tokens - 1

    @property
    def fill_ids(self) -> list[int]:
        """Tokens whose KV is in the row: ``(origin_input_ids + output_ids)[:kv_len]``."""
        return (self.origin_input_ids + self.output_ids)[: self.kv_len]

    @property
    def prompt_done(self) -> bool:
        return self.kv_len >= len(self.origin_input_ids)

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens

    @property
    def next_input_ids(self) -> list[int]:
        """Tokens after ``kv_len``: the rest of the prompt, or the last sampled token."""
        return (self.origin_input_ids + self.output_ids)[self.kv_len :]

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

"""A generation request: its tokens, its row of KV slots and the cache bookkeeping on it."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.radix.key import check_extra_key
from hicache.radix.tokens import RequestTokens, TokenBuffer

# The first item of a salted namespace (``request_namespace``); a submitted ``extra_key`` of
# that shape is refused, so no unsalted request can name a salted namespace.
SALT_TAG = "hicache.cache_salt"


def request_namespace(extra_key: Hashable | None, cache_salt: str | None) -> Hashable | None:
    """The namespace of a request's cache entries: its tree nodes and storage pages.

    ``extra_key`` unchanged when ``cache_salt`` is None, else ``(SALT_TAG, cache_salt,
    extra_key)``: requests of different salts (or one salted, one not) never share a node or
    a page, whatever their ``extra_key``. The storage tier seeds its page hashes with this
    namespace, so the isolation reaches L3.

    ``TypeError`` for an ``extra_key`` outside ``check_extra_key``'s types or a ``cache_salt``
    that is neither a str nor None; ``ValueError`` for an ``extra_key`` that already has the
    salted shape (a tuple of three starting with ``SALT_TAG``).
    """
    check_extra_key(extra_key)
    if type(extra_key) is tuple and len(extra_key) == 3 and extra_key[0] == SALT_TAG:
        raise ValueError(f"extra_key must not start with {SALT_TAG!r} (reserved for cache_salt)")
    if cache_salt is None:
        return extra_key
    if not isinstance(cache_salt, str):
        raise TypeError(f"cache_salt must be a str or None, got {type(cache_salt).__name__}")
    return (SALT_TAG, cache_salt, extra_key)


class Status(enum.Enum):
    WAITING = "waiting"  # queued; holds nothing
    PREFILL = "prefill"  # admitted; prompt KV being computed chunk by chunk
    DECODE = "decode"  # prompt done; one token per step
    FINISHED = "finished"  # KV handed to the cache, row freed
    REJECTED = "rejected"  # can never fit; ``error`` says why, holds nothing
    ABORTED = "aborted"  # withdrawn while waiting (``Engine.abort``); holds nothing


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
    extra_key : the namespace of the request's cache entries, ``request_namespace(extra_key,
        cache_salt)`` of what was submitted.
    cache_salt : the tenant salt submitted with the request (None: none).
    device_hit, host_hit, storage_hit, computed : prompt tokens served from L1, loaded back
        from L2, brought from L3 by the request's own prefetch (then loaded back through L2;
        not counted in ``host_hit``), and computed by the model.
    mamba_branching_seqlen : the branch point its admission match reported (the end of the
        longest cached prefix without a recurrent state, ``HybridMatchResult``), or None; the
        scheduler ends a prompt chunk there so the cache checkpoints the state at that node.
    mamba_next_track_idx, mamba_last_track_seqlen : SGLang's decode tracking (a row with
        track slots, ``HybridMemory.track``): the track slot the next page boundary's state
        goes to, and the tokens the last tracked state follows (None: none tracked).
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
    storage_hit: int = 0
    cache_salt: str | None = None
    computed: int = 0
    mamba_branching_seqlen: int | None = None
    mamba_next_track_idx: int = 0
    mamba_last_track_seqlen: int | None = None
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
        """Tokens after ``kv_len``: the rest of the prompt, or the last sampled token (no copy
        of the whole prompt)."""
        past = self.kv_len - len(self.origin_input_ids)
        if past >= 0:
            return self.output_ids[past:]
        return self.origin_input_ids[self.kv_len :] + self.output_ids

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

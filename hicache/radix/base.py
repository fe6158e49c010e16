"""The prefix-cache contract: what every call does, changes and raises.

Implementations (``RadixCache``, ``HiRadixCache``) keep their own docstrings short and refer here.
Also the pool interfaces the cache is written against and its frozen config; the match result
is ``match.MatchResult``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from hicache.radix.match import MatchResult
from hicache.radix.node import TreeNode
from hicache.radix.stats import CacheStats
from hicache.radix.tier import TIER_CHANGES, TierChain
from hicache.threads import ThreadBound


class ReqToTokenTable(Protocol):
    """The slice of ``ReqToTokenPool`` the tree uses: rows of int32 slot ids per request."""

    req_to_token: torch.Tensor

    def is_allocated(self, idx: int) -> bool: ...
    def free(self, idx: int | list[int]) -> None: ...
    def write(self, indices: Any, values: torch.Tensor) -> None: ...


class BasePrefixCache(ABC, ThreadBound):
    """A prefix cache over KV slots: keys are token-id prefixes, values are slot indices.

    The calls about the tiers below the device (``init_load_back`` .. ``note_prefill``) are
    written here once: each forwards to ``tiers``, the first link of the cache's chain of tiers
    (``tier.TierChain``; ``NoLowerTier`` without a host tier).

    Keys are RadixKeys or sequences of ints and are truncated to whole pages. The cache owns the
    slots of its nodes; a caller owns a slot until ``insert``/``cache_*_req`` hands it over and
    must not use cached slots without holding a lock on the node that reaches them.
    Bad public input raises ``TypeError``/``ValueError`` before any state changes.
    """

    tiers: TierChain
    thread_guarded = (  # the calls that change the cache, from one thread (``hicache.threads``)
        "match_prefix insert evict inc_lock_ref dec_lock_ref cache_finished_req "
        "cache_unfinished_req reset " + TIER_CHANGES
    )

    @abstractmethod
    def match_prefix(self, key: Any) -> MatchResult:
        """Longest cached page-aligned prefix of ``key``.

        Changes: splits a node where the match ends inside it, and records an access (recency,
        hit count) on every matched node. Takes no lock: call ``inc_lock_ref`` on
        ``last_device_node`` before the next ``evict``. Joins no slot indices: the result's
        ``device_indices`` are joined when first read (``match.MatchResult``).
        """

    @abstractmethod
    def insert(self, key: Any, value: torch.Tensor | None = None, *, priority: int = 0) -> int:
        """Cache ``key`` -> ``value`` and return how many leading tokens were already cached.

        Parameters
        ----------
        key : RadixKey or sequence of ints; only its whole pages are stored.
        value : integer tensor ``[len(key)]`` of slots (any device); None stores the token ids
            themselves (pure index; only without an allocator). The tree keeps an int64 copy
            of the stored part. Positions already cached are never overwritten: the caller
            still owns ``value[:returned]`` (duplicates to free) and the trailing partial page.
        priority : raises the priority of every node on the path to at least this.

        Raises ``ValueError`` (no change) when, with an allocator, ``value`` holds a slot
        outside the allocator's usable range (slot 0's page is reserved), a page's slots out of
        order or straddling two pages, or a slot twice (always checked for CPU slots; CUDA slots
        under ``HICACHE_CHECK_DEVICE_INDICES=1``), or, under the debug switch
        ``HICACHE_CHECK_OWNERSHIP=1``, a slot the tree would take that is free in the allocator
        or owned by a node (see ``radix.ownership``).
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves in policy order until ``num_tokens`` device tokens are freed.

        Whole nodes are evicted, so the result (tokens freed) may exceed ``num_tokens``; it is
        smaller only when nothing more is evictable. Slots go back through the allocator.
        """

    @abstractmethod
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock ``node`` and its ancestors; returns tokens moved from evictable to protected.

        The root is a no-op. ``ValueError`` if ``node`` is not in this tree.
        """

    @abstractmethod
    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one ``inc_lock_ref``; returns tokens moved from protected to evictable.

        The root is a no-op. ``ValueError`` (no change) unless ``node`` holds a lock of its own
        (an ``inc_lock_ref(node)`` not yet undone; a lock on a descendant does not count).
        """

    @abstractmethod
    def evictable_size(self) -> int:
        """Device tokens in unlocked nodes."""

    @abstractmethod
    def protected_size(self) -> int:
        """Device tokens in locked nodes."""

    @abstractmethod
    def total_size(self) -> int:
        """Device tokens in the tree (``evictable_size() + protected_size()``)."""

    @abstractmethod
    def cache_finished_req(self, req: Any, *, trusted: bool = False) -> None:
        """Hand a finished request's KV to the cache and release its row and lock.

        Row ``req.req_pool_idx`` holds the slots of the first ``req.kv_len`` tokens of
        ``origin_input_ids + output_ids``. Its whole pages are inserted; the slots at positions
        ``[req.cache_protected_len, prefix)`` that the tree already held are duplicates and freed,
        as is the unaligned tail ``[aligned, kv_len)``. Then the row is freed,
        ``req.req_pool_idx`` set to None and ``req.last_node`` unlocked (and set to None). Slots
        past ``kv_len`` are not touched.

        Validated before any change (``TypeError``/``ValueError``/``IndexError`` naming the
        field): ``req_pool_idx`` is an int row the request pool has allocated (None: never
        scheduled or already finished, so finishing twice raises); ``kv_len`` fits the row;
        ``last_node`` is in this tree, locked by an ``inc_lock_ref`` of its own and a device
        node on the path of the request's tokens; ``cache_protected_len`` is a page multiple no
        deeper than ``last_node``; the request's own slots (row positions
        ``[cache_protected_len, kv_len)``) pass the checks ``insert`` applies to ``value``.
        ``trusted=True`` (keyword-only; ``hicache.engine``'s own requests, whose row, lock and
        slots it set up itself) checks only ``kv_len``; every other caller leaves it False.
        """

    @abstractmethod
    def cache_unfinished_req(self, req: Any, *, trusted: bool = False) -> None:
        """Cache a running request's computed pages (chunked prefill) and keep it running.

        As ``cache_finished_req`` for the whole pages of the first ``req.kv_len`` tokens, but the
        row stays: its duplicate positions are rewritten to the tree's slots, the lock moves to
        the new last node, ``req.prefix_indices`` becomes the tree's slots plus the request's
        unaligned tail (still owned by the request), and ``req.cache_protected_len`` the aligned
        length. Validated as ``cache_finished_req``.
        """

    # ---- lower tiers: no-ops without one (``RadixCache``), the host tier in ``HiRadixCache`` ----

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None = None
    ) -> tuple[torch.Tensor, TreeNode]:
        """Queue the load of the host-only nodes above and including ``last_host_node``.

        Parameters
        ----------
        last_host_node : ``MatchResult.last_host_node``, a node of this tree (``TypeError`` /
            ``ValueError``); with a host tier it must be backed up (or the root).
        host_hit_length : ``MatchResult.host_hit_length``, an int ``>= 0``; below
            ``load_back_threshold`` nothing is loaded (recomputing is cheaper).
        mem_quota : most device slots the load may take (an int ``>= 0``), or None.

        Returns ``(device_indices, node)``: int64 ``[n]`` device slots of the loaded tokens
        (allocator device) and ``last_host_node``, now on the device and locked until its
        load lands; or an empty tensor and the deepest device node at or above it when nothing
        was loaded (no host tier, below the threshold, over ``mem_quota``, the device short even
        after evicting). The caller locks the returned node for its request; the forward pass
        that reads the slots must ``consume_load_batch(ready_to_load_host_cache())`` first.
        Validated before any change.
        """
        return self.tiers.init_load_back(last_host_node, host_hit_length, mem_quota)

    def ready_to_load_host_cache(self) -> int:
        """Issue the queued loads (layer by layer); returns the load batch index, or -1 when
        nothing was queued (always -1 without a host tier). Pops finished acks (never blocks)."""
        return self.tiers.ready_to_load_host_cache()

    def consume_load_batch(self, index: int) -> None:
        """The next forward pass reads the KV of load batch ``index`` layer by layer (the value
        ``ready_to_load_host_cache`` returned; -1: nothing was loaded, wait on nothing).

        ``TypeError`` for a non-int, ``ValueError`` for an index that is neither -1 nor a
        batch issued since the last reset (only -1 without a host tier); no change then.
        """
        self.tiers.consume_load_batch(index)

    def check_hicache_events(self) -> None:
        """Issue queued writes, then pop finished write and load acks and unlock their nodes
        (never blocks; a no-op without a host tier)."""
        self.tiers.check_hicache_events()

    def drain_transfers(self) -> None:
        """Issue queued writes, block until every issued write and load has landed, then pop
        their acks and unlock their nodes (a no-op without a host tier). Queued loads are not
        issued: ``ready_to_load_host_cache`` does that for its forward pass."""
        self.tiers.drain_transfers()

    def host_size(self) -> int:
        """Tokens with a host copy, writes in flight included (0 without a host tier)."""
        return self.tiers.host_size()

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host tokens (an int ``>= 0``) by deleting unlocked
        childless host-only nodes in policy order; never the host copy of a node still on the
        device. Returns the tokens freed (fewer only when none is left; 0 without a host tier).
        """
        return self.tiers.evict_host(num_tokens)

    # ---- storage tier (L3): no-ops without one ------------------------------------------------

    def has_storage_tier(self) -> bool:
        """Whether a storage tier is attached (a query: no state change, no counter): without
        one the storage calls below do nothing, so a caller may skip gathering their arguments
        (``stats().storage`` says the same at the cost of a whole snapshot)."""
        return False

    def prefetch_from_storage(
        self,
        req_id: str,
        last_host_node: TreeNode,
        new_input_tokens: Any,
        last_hash: bytes | None = None,
    ) -> bool:
        """Start fetching from storage the KV of ``new_input_tokens`` into host slots.

        Parameters
        ----------
        req_id : the request's id (a str); one prefetch per id at a time (``ValueError``).
        last_host_node : ``MatchResult.last_host_node`` of the request's match.
        new_input_tokens : the request's tokens after that match, a ``RadixKey`` (its
            ``extra_key`` names the namespace) or a sequence of ints (default namespace).
        last_hash : ignored when the node has its hashes (they are computed from the tree);
            accepted for SGLang's signature.

        Returns True when a prefetch started (the request should wait on
        ``check_prefetch_progress``); False without a storage tier, below the prefetch
        threshold, or when loading would be slower than recomputing. Host slots are taken
        only once storage says the pages are there. Validated before any change.
        """
        return self.tiers.prefetch_from_storage(req_id, last_host_node, new_input_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        """Whether request ``req_id`` may be scheduled now (True when it has no prefetch).

        When the prefetch policy lets it go (done, ``best_effort``, timed out), the pages that
        arrived, as a whole-page prefix, are inserted as host-only nodes under the request's
        ``last_host_node`` (a fresh ``match_prefix`` finds them and ``init_load_back`` loads
        them), the rest is cancelled, and True is returned."""
        return self.tiers.check_prefetch_progress(req_id)

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        """Tokens the finished prefetch of ``req_id`` added to the tree (0 if none); forgets
        the figure."""
        return self.tiers.pop_prefetch_loaded_tokens(req_id)

    def release_aborted_request(self, req_id: str) -> None:
        """Cancel ``req_id``'s prefetch (the request was aborted); its host slots are freed
        once its I/O has stopped. A no-op for an unknown id."""
        self.tiers.release_aborted_request(req_id)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """Report a measured prefill (``tokens`` computed in ``seconds``): the cost model
        compares it with each tier's measured bandwidth to skip loads slower than recompute."""
        self.tiers.note_prefill(tokens, seconds)

    @abstractmethod
    def stats(self) -> CacheStats:
        """A frozen snapshot of the cache's counters and sizes (``radix.stats``); changes nothing
        and never blocks (transfer time counts the batches that have completed).

        ``prefix`` (lookups, hits per tier, inserts) and ``device`` always; ``host`` and
        ``transfer`` with a host tier, else None. Counters only grow, across ``reset`` too.
        Counting is a few integer increments per call, always on.
        """

    @abstractmethod
    def reset(self) -> None:
        """Drop every node and return its device slots to the allocator.

        ``ValueError`` (no change) while any node is locked by a live request.
        """

    @abstractmethod
    def pretty_print(self) -> None:
        """Print the tree, one node per line."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise ``RuntimeError`` if the tree's bookkeeping is inconsistent."""

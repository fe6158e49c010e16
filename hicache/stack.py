"""Wire a KV cache stack in the right order: device pool -> allocator -> request pool -> cache.

``build_kv_stack`` is the one call an embedding scheduler needs: it validates every argument
first (nothing is allocated when one is wrong), then builds the device KV pool, the slot
allocator over it, the request-to-token table and a ``RadixCache`` (device only) or, given a
``HiCacheConfig``, a ``HiRadixCache`` with a host tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.checks import check_int
from hicache.devices import canonical_device
from hicache.kv_events import make_sink
from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.pools.host_layouts import check_ram, host_slots
from hicache.radix import HiCacheConfig, RadixCache, RadixCacheConfig
from hicache.radix.events import EventSink
from hicache.tiers.hiradix_cache import HiRadixCache

_MHA_DIMS = ("head_num", "head_dim")
_MLA_DIMS = ("kv_lora_rank", "qk_rope_head_dim")


@dataclass(frozen=True)
class KVStack:
    """What ``build_kv_stack`` built, each part over the one before it.

    Attributes
    ----------
    kv_pool : the device KV pool (``MHATokenToKVPool`` or ``MLATokenToKVPool``), one buffer
        ``[size + page_size, heads, dim]`` per layer on ``device``.
    allocator : the ``TokenToKVPoolAllocator`` of its slots (``get_kvcache()`` is ``kv_pool``).
    req_to_token_pool : the ``ReqToTokenPool``, ``[max_requests, row]`` int32 on ``device``.
    cache : a ``RadixCache``, or a ``HiRadixCache`` (a subclass) when a host tier was asked for.
    events : where the cache's KV events go (``kv_events``), or None.
    owns_events : whether ``events`` is a publisher built here from a setting (``close``
        closes it; a sink the caller passed is the caller's).
    """

    kv_pool: MHATokenToKVPool | MLATokenToKVPool
    allocator: TokenToKVPoolAllocator
    req_to_token_pool: ReqToTokenPool
    cache: RadixCache
    events: EventSink | None = None
    owns_events: bool = False

    def close(self) -> None:
        """Close the cache's storage tier and the publisher of ``owns_events`` (idempotent)."""
        close = getattr(self.cache, "close", None)
        if close is not None:
            close()
        if self.owns_events:
            getattr(self.events, "close")()  # noqa: B009 (a ZmqEventPublisher)


def build_kv_stack(
    *,
    layer_num: int,
    dtype: torch.dtype,
    size: int,
    max_requests: int,
    max_context_len: int,
    page_size: int = 1,
    head_num: int | None = None,
    head_dim: int | None = None,
    kv_lora_rank: int | None = None,
    qk_rope_head_dim: int | None = None,
    device: torch.device | str = "cpu",
    hicache: HiCacheConfig | None = None,
    eviction_policy: str = "lru",
    tp_group: Any = None,
    kv_events: Any = None,
) -> KVStack:
    """Build and wire a device pool, its allocator, a request pool and a radix cache.

    Parameters
    ----------
    layer_num, dtype : model layers and the KV dtype (a floating ``torch.dtype``; fp8 is
        stored as uint8).
    head_num, head_dim : MHA/GQA geometry (KV heads and their dim); or
    kv_lora_rank, qk_rope_head_dim : MLA geometry. Give exactly one of the two pairs.
    size : usable device KV slots, a multiple of ``page_size``.
    max_requests : rows of the request-to-token table (requests in flight at once).
    max_context_len : longest request in tokens; rows are rounded up to whole pages.
    page_size : tokens per page.
    device : where the device pool and the request table live (``"cpu"``, ``"cuda[:N]"``).
    hicache : host-tier settings: a ``HiRadixCache`` over a host pool is built (pinned on
        CUDA); None builds a device-only ``RadixCache``.
    eviction_policy : the tree's eviction order (``hicache.radix.EVICTION_POLICIES``).
    tp_group : the cache's TP group (``RadixCache``): None, a process group or a ``TPGroup``;
        the geometry given is this rank's shard (MHA: its KV heads; MLA: the whole latent).
    kv_events : KV events (``hicache.radix.events``) of every tier: None (off), a ZMQ
        endpoint (``"tcp://127.0.0.1:5557"``) or a ``hicache.kv_events.KVEventsConfig`` (a
        publisher in SGLang's wire format, ``pip install 'hicache[events]'``; ``close``
        closes it), or an ``EventSink`` for an in-process consumer.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is allocated: a non-int size, a size not a page
        multiple, a missing or doubled geometry, a non-floating dtype, an unknown device or
        policy, a ``hicache`` that is not a ``HiCacheConfig``, a host pool that would hold no
        page or does not fit in RAM, or a bad ``kv_events``.
    """
    dims = _check_geometry(
        head_num=head_num,
        head_dim=head_dim,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
    )
    _check_sizes(layer_num, size, max_requests, max_context_len, page_size)
    RadixCacheConfig(page_size, eviction_policy)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    device = canonical_device(device)
    if hicache is not None:
        _check_host_tier(hicache, size, page_size, layer_num * _token_bytes(dims, dtype))
    sink = make_sink(kv_events)  # last check: a publisher binds its sockets
    kv_pool = _device_pool(dims, size, page_size, dtype, layer_num, device)
    allocator = TokenToKVPoolAllocator(size, page_size, device, kvcache=kv_pool)
    row_len = -(-max_context_len // page_size) * page_size
    req_pool = ReqToTokenPool(max_requests, row_len, device)
    cache = make_cache(
        req_pool,
        allocator,
        page_size,
        hicache=hicache,
        eviction_policy=eviction_policy,
        tp_group=tp_group,
        event_sink=sink,
    )
    return KVStack(kv_pool, allocator, req_pool, cache, sink, sink is not kv_events)


def make_cache(
    req_to_token_pool: ReqToTokenPool | None,
    allocator: TokenToKVPoolAllocator | None,
    page_size: int = 1,
    *,
    hicache: HiCacheConfig | None = None,
    eviction_policy: str = "lru",
    tp_group: Any = None,
    event_sink: EventSink | None = None,
) -> RadixCache:
    """A ``HiRadixCache`` over the pools when ``hicache`` is given, else a ``RadixCache``;
    its KV events to ``event_sink`` (None: off)."""
    kw: dict[str, Any] = {"eviction_policy": eviction_policy, "tp_group": tp_group}
    if hicache is None:
        return RadixCache(req_to_token_pool, allocator, page_size, event_sink=event_sink, **kw)
    return HiRadixCache(
        req_to_token_pool, allocator, page_size, config=hicache, event_sink=event_sink, **kw
    )


def _check_geometry(**dims: int | None) -> dict[str, int]:
    """The given pair of dims (MHA or MLA), checked: ``ValueError`` unless exactly one pair is
    given whole, ``TypeError``/``ValueError`` for a dim that is not a positive int."""
    given = {name for name, value in dims.items() if value is not None}
    pairs = [pair for pair in (_MHA_DIMS, _MLA_DIMS) if given & set(pair)]
    if len(pairs) != 1 or not set(pairs[0]) <= given:
        raise ValueError(
            f"give either {' and '.join(_MHA_DIMS)} (MHA) or {' and '.join(_MLA_DIMS)} (MLA), "
            f"got {sorted(given) or 'neither'}"
        )
    return {name: check_int(name, dims[name], minimum=1) for name in pairs[0]}


def _check_sizes(
    layer_num: int, size: int, max_requests: int, max_context_len: int, page_size: int
) -> None:
    """Positive ints, ``size`` a multiple of ``page_size``."""
    for name, value in (
        ("layer_num", layer_num),
        ("size", size),
        ("max_requests", max_requests),
        ("max_context_len", max_context_len),
        ("page_size", page_size),
    ):
        check_int(name, value, minimum=1)
    if size % page_size:
        raise ValueError(f"size must be a multiple of page_size={page_size}, got {size}")


def _token_bytes(dims: dict[str, int], dtype: torch.dtype) -> int:
    """Bytes of one token in one layer: K and V (MHA) or the one latent (MLA)."""
    if "head_num" in dims:
        return 2 * dims["head_num"] * dims["head_dim"] * dtype.itemsize
    return (dims["kv_lora_rank"] + dims["qk_rope_head_dim"]) * dtype.itemsize


def _check_host_tier(hicache: Any, size: int, page_size: int, bytes_per_slot: int) -> None:
    """The host pool ``hicache`` describes holds at least one page and fits in RAM."""
    if not isinstance(hicache, HiCacheConfig):
        raise TypeError(f"hicache must be a HiCacheConfig or None, got {type(hicache).__name__}")
    slots = host_slots(
        size, hicache.hicache_ratio, hicache.hicache_size_gb, page_size, bytes_per_slot
    )
    check_ram(slots * bytes_per_slot)


def _device_pool(
    dims: dict[str, int],
    size: int,
    page_size: int,
    dtype: torch.dtype,
    layer_num: int,
    device: torch.device,
) -> MHATokenToKVPool | MLATokenToKVPool:
    if "head_num" in dims:
        return MHATokenToKVPool(
            size, page_size, dtype, dims["head_num"], dims["head_dim"], layer_num, device
        )
    return MLATokenToKVPool(
        size, page_size, dtype, dims["kv_lora_rank"], dims["qk_rope_head_dim"], layer_num, device
    )

"""KV events: which pages a cache's tiers gained or lost, for cache-aware routers.

Shaped like SGLang's and vLLM's KV events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``): a block is one page, named by its chained page hash (``page_hash``), and
``medium`` names the tier with SGLang's ``StorageMedium`` values: ``GPU`` for the device tier
(also on a CPU-only host: it is L1), ``CPU_PINNED`` for the host tier, ``DISK`` for the file
store and ``EXTERNAL`` for Mooncake (and any other backend). One event per page, as SGLang
publishes them (a ``BlockStored`` names its parent page, so a router can chain them). The
device and host tiers report every page once each time they gain it and once each time they
lose it; the storage tier reports each page a backup wrote (or found present: the store is
write-once, so a repeated ``BlockStored`` names a page already held) and each page an eviction
of its backend removed (the file store's LRU; Mooncake evicts without telling its clients).
``AllBlocksCleared`` (on ``reset``, and first on a sink given to a new cache) removes every
page from every medium: the store keeps its pages, but the instance vouches only for those it
writes again.
A split reports nothing (the same pages stay in the same tiers).

Events are opt-in (``RadixCache(..., enable_kv_events=True)`` or ``event_sink=...``): without
them no hash is computed and each change of a tier costs one ``if``. They go to an
``EventSink``: the cache's own in-process ``EventQueue`` (drained by ``take_events()``), one
given by the caller, or ``hicache.kv_events``' ZMQ publisher in SGLang's wire format. Device
and host events come from the thread that calls the cache, storage events from the storage
tier's backup thread, so a sink must accept calls from both.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from hicache.radix.components import FULL
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes

__all__ = [
    "CPU_PINNED",
    "DEVICE",
    "DISK",
    "EXTERNAL",
    "GPU",
    "HOST",
    "MEDIA",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventQueue",
    "EventSink",
    "KVEvent",
    "Medium",
    "NodeEvents",
    "cache_events",
    "events_enabled",
]

Medium = Literal["GPU", "CPU_PINNED", "DISK", "EXTERNAL"]  # SGLang's StorageMedium values
GPU: Medium = "GPU"  # L1, the device tier
CPU_PINNED: Medium = "CPU_PINNED"  # L2, the host tier
DISK: Medium = "DISK"  # L3 on this machine: the file store
EXTERNAL: Medium = "EXTERNAL"  # L3 elsewhere: Mooncake Store, or a caller's backend
MEDIA: tuple[Medium, ...] = (GPU, CPU_PINNED, DISK, EXTERNAL)
DEVICE, HOST = GPU, CPU_PINNED  # the media of the device and host tiers
# ``tier``: the name the events had before ``medium`` (kept as a read-only alias).
_TIER_NAMES = {GPU: "device", CPU_PINNED: "host", DISK: "storage", EXTERNAL: "storage"}


@dataclass(frozen=True)
class BlockStored:
    """``medium`` gained the pages ``block_hashes`` (32-byte digests, root side first; the cache
    publishes one page per event).

    ``parent_block_hash`` is the hash of the page before the first (None at the start of a
    prefix); ``token_ids`` the tokens of the pages, ``block_size`` tokens each; ``namespace``
    the ``extra_key`` they are cached under; ``component`` which of a node's components
    (``components.COMPONENTS``: ``full`` KV, ``swa`` KV, a ``mamba`` state after the page)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: Medium
    namespace: Hashable | None
    component: str = FULL

    @property
    def tier(self) -> str:
        """The former name of ``medium``: ``device``, ``host`` or ``storage``."""
        return _TIER_NAMES[self.medium]


@dataclass(frozen=True)
class BlockRemoved:
    """``medium`` lost ``component`` (as in ``BlockStored``) of the pages ``block_hashes``."""

    block_hashes: tuple[bytes, ...]
    medium: Medium
    component: str = FULL

    @property
    def tier(self) -> str:
        """The former name of ``medium``: ``device``, ``host`` or ``storage``."""
        return _TIER_NAMES[self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every tier lost every page."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventSink(Protocol):
    """Where a cache's KV events go, in the order the changes happened (per medium)."""

    def publish(self, event: KVEvent) -> None:
        """Accept ``event`` from any thread, quickly; must not raise (the cache has already
        changed)."""


class EventQueue:
    """An in-process ``EventSink``: events wait in a list until ``take_events`` drains it."""

    def __init__(self) -> None:
        self._events: list[KVEvent] = []
        self._lock = threading.Lock()  # the storage tier publishes from its backup thread

    def publish(self, event: KVEvent) -> None:
        with self._lock:
            self._events.append(event)

    def take_events(self) -> list[KVEvent]:
        """The events published since the last call, oldest first; the queue is left empty."""
        with self._lock:
            events, self._events = self._events, []
        return events


class NodeEvents:
    """Turns a tier's gain or loss of one node's pages into one event per page for ``sink``."""

    def __init__(self, sink: EventSink, page_size: int) -> None:
        self.sink, self.page_size = sink, page_size

    def stored(self, node: TreeNode, medium: Medium, component: str = FULL) -> None:
        """``medium`` now holds ``component`` of the pages of ``node`` (a node of the tree,
        below the root)."""
        for event in self.stored_events(node, medium, component):
            self.sink.publish(event)

    def stored_events(
        self, node: TreeNode, medium: Medium, component: str = FULL
    ) -> list[BlockStored]:
        """The events ``stored`` publishes, one per page of ``node``, without publishing them
        (the storage tier publishes them once its backup has written the pages)."""
        hashes, page = node_hashes(node, self.page_size), self.page_size
        parent = node.parent
        above = None if parent is None or parent.hash_value is None else parent.hash_value[-1]
        tokens = node.key.tolist()
        events = []
        for i, digest in enumerate(hashes):
            ids = tuple(tokens[i * page : (i + 1) * page])
            event = BlockStored((digest,), above, ids, page, medium, node.extra_key, component)
            events.append(event)
            above = digest
        return events

    def removed(self, node: TreeNode, medium: Medium, component: str = FULL) -> None:
        """``medium`` no longer holds ``component`` of the pages of ``node``."""
        self.removed_pages(node_hashes(node, self.page_size), medium, component)

    def removed_pages(self, hashes: list[bytes], medium: Medium, component: str = FULL) -> None:
        """``medium`` no longer holds ``component`` of the pages ``hashes``."""
        for digest in hashes:
            self.sink.publish(BlockRemoved((digest,), medium, component))

    def cleared(self) -> None:
        self.sink.publish(AllBlocksCleared())


def events_enabled(**flags: object) -> bool:
    """Whether any of the keyword switches ``flags`` is on; ``TypeError`` naming the first that
    is not a bool."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return any(flags.values())


def cache_events(
    sink: object, page_size: int, enable_kv_events: bool, enable_kv_cache_events: bool
) -> tuple[EventQueue | None, NodeEvents | None]:
    """A new cache's in-process queue (events on, no ``sink`` given) and its ``NodeEvents``
    (None: events off). A given ``sink`` first gets ``AllBlocksCleared`` (the stream may
    carry an earlier cache's pages). ``TypeError`` for a switch that is not a bool or a
    ``sink`` without a callable ``publish``."""
    on = events_enabled(
        enable_kv_events=enable_kv_events, enable_kv_cache_events=enable_kv_cache_events
    )
    if sink is not None and not callable(getattr(sink, "publish", None)):
        raise TypeError(f"event_sink must have a publish(event) method, got {type(sink).__name__}")
    queue = EventQueue() if on and sink is None else None
    target = cast("EventSink | None", sink) or queue
    if target is None:
        return None, None
    events = NodeEvents(target, page_size)
    if queue is None:
        events.cleared()
    return queue, events

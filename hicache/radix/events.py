"""KV events: which pages a cache's tiers gained or lost, for cache-aware routers.

Shaped like vLLM's and SGLang's KV events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``): a block is one page, named by its chained page hash (``page_hash``), and
``tier`` plays the part of their ``medium``. One event per page, as SGLang publishes them (a
``BlockStored`` names its parent page, so a router can chain them). Every page is reported once
each time a tier gains it and once each time it loses it; ``AllBlocksCleared`` (on ``reset``)
removes every page from every tier. A split reports nothing
(the same pages stay in the same tiers).

Events are opt-in (``RadixCache(..., enable_kv_events=True)``): without them no hash is computed
and each change of a tier costs one ``if``. They go to an ``EventSink``; the cache's own is an
in-process ``EventQueue`` drained by ``take_events()``. No network publisher is shipped (no
ZMQ dependency): a consumer drains the queue and forwards what it takes.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, Protocol

from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes

__all__ = [
    "DEVICE",
    "HOST",
    "STORAGE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventQueue",
    "EventSink",
    "KVEvent",
    "NodeEvents",
    "Tier",
    "events_enabled",
]

Tier = Literal["device", "host", "storage"]
DEVICE: Tier = "device"
HOST: Tier = "host"
STORAGE: Tier = "storage"  # reserved for the storage tier (issue 17)


@dataclass(frozen=True)
class BlockStored:
    """``tier`` gained the pages ``block_hashes`` (32-byte digests, root side first; the cache
    publishes one page per event).

    ``parent_block_hash`` is the hash of the page before the first (None at the start of a
    prefix); ``token_ids`` the tokens of the pages, ``block_size`` tokens each; ``namespace``
    the ``extra_key`` they are cached under."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    tier: Tier
    namespace: Hashable | None


@dataclass(frozen=True)
class BlockRemoved:
    """``tier`` lost the pages ``block_hashes``."""

    block_hashes: tuple[bytes, ...]
    tier: Tier


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every tier lost every page."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventSink(Protocol):
    """Where a cache's KV events go, in the order the changes happened."""

    def publish(self, event: KVEvent) -> None:
        """Accept ``event``; must not raise (the cache has already changed)."""


class EventQueue:
    """An in-process ``EventSink``: events wait in a list until ``take_events`` drains it."""

    def __init__(self) -> None:
        self._events: list[KVEvent] = []

    def publish(self, event: KVEvent) -> None:
        self._events.append(event)

    def take_events(self) -> list[KVEvent]:
        """The events published since the last call, oldest first; the queue is left empty."""
        events, self._events = self._events, []
        return events


class NodeEvents:
    """Turns a tier's gain or loss of one node's pages into one event per page for ``sink``."""

    def __init__(self, sink: EventSink, page_size: int) -> None:
        self.sink, self.page_size = sink, page_size

    def stored(self, node: TreeNode, tier: Tier) -> None:
        """``tier`` now holds the pages of ``node`` (a node of the tree, below the root)."""
        hashes, page = node_hashes(node, self.page_size), self.page_size
        parent = node.parent
        above = None if parent is None or parent.hash_value is None else parent.hash_value[-1]
        tokens = node.key.tolist()
        for i, digest in enumerate(hashes):
            ids = tuple(tokens[i * page : (i + 1) * page])
            self.sink.publish(BlockStored((digest,), above, ids, page, tier, node.extra_key))
            above = digest

    def removed(self, node: TreeNode, tier: Tier) -> None:
        """``tier`` no longer holds the pages of ``node``."""
        for digest in node_hashes(node, self.page_size):
            self.sink.publish(BlockRemoved((digest,), tier))

    def cleared(self) -> None:
        self.sink.publish(AllBlocksCleared())


def events_enabled(**flags: object) -> bool:
    """Whether any of the keyword switches ``flags`` is on; ``TypeError`` naming the first that
    is not a bool."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return any(flags.values())

"""A KV-aware router's view of several hicache instances, built only from their KV events.

    hicache bench --kv-events tcp://127.0.0.1:5557 --kv-events-replay tcp://127.0.0.1:5558 &
    python examples/kv_router.py tcp://127.0.0.1:5557,tcp://127.0.0.1:5558 --idle-s 5

Each argument is one instance: its PUB endpoint and, after a comma, its replay endpoint. The
router subscribes to every instance (SGLang's wire format: ``hicache.kv_events``), asks for a
replay whenever a sequence number skips, and keeps per instance and per medium (``GPU``,
``CPU_PINNED``, ``DISK``, ``EXTERNAL``) the set of blocks held, plus each block's parent and
tokens. ``route(tokens)`` answers which instance holds the longest prefix of ``tokens`` and in
which tiers (each page counted in the fastest medium holding it). It stops after ``--idle-s``
seconds without events (once some came) and prints what each instance holds.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from hicache.kv_events.subscriber import KVEventSubscriber
from hicache.kv_events.wire import AllBlocksCleared, BlockStored, decode_batch

MEDIA = ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")  # fastest first
ChainKey = tuple[str | None, int | None, tuple[int, ...]]  # (cache_salt, parent, tokens)


@dataclass
class BlockIndex:
    """What one instance holds: ``held[medium]`` block hashes, and ``chain`` (cache_salt,
    parent, tokens) -> block for every block held somewhere, to walk a prompt page by page."""

    held: dict[str, set[int]] = field(default_factory=lambda: {m: set() for m in MEDIA})
    chain: dict[ChainKey, int] = field(default_factory=dict)
    key_of: dict[int, ChainKey] = field(default_factory=dict)
    block_size: int = 0

    def apply(self, payload: bytes) -> None:
        """Apply one ``KVEventBatch`` payload."""
        for event in decode_batch(payload).events:
            if isinstance(event, AllBlocksCleared):
                for blocks in self.held.values():
                    blocks.clear()
                self.chain.clear()
                self.key_of.clear()
            elif isinstance(event, BlockStored):
                self._stored(event)
            else:
                for block in event.block_hashes:
                    self.held[event.medium or "GPU"].discard(block)
                    self._forget_if_gone(block)

    def _stored(self, event: BlockStored) -> None:
        self.block_size = event.block_size
        parent, size = event.parent_block_hash, event.block_size
        for i, block in enumerate(event.block_hashes):
            key = (event.cache_salt, parent, tuple(event.token_ids[i * size : (i + 1) * size]))
            self.held[event.medium or "GPU"].add(block)
            self.chain[key], self.key_of[block] = block, key
            parent = block

    def _forget_if_gone(self, block: int) -> None:
        if not any(block in blocks for blocks in self.held.values()):
            key = self.key_of.pop(block, None)
            if key is not None and self.chain.get(key) == block:
                del self.chain[key]

    def prefix(self, tokens: list[int], cache_salt: str | None = None) -> dict[str, int]:
        """Tokens of the longest held prefix of ``tokens``, per fastest medium holding them."""
        found = dict.fromkeys(MEDIA, 0)
        size, parent = self.block_size, None
        if not size:  # nothing stored yet
            return found
        for start in range(0, len(tokens) - size + 1, size):
            block = self.chain.get((cache_salt, parent, tuple(tokens[start : start + size])))
            medium = next((m for m in MEDIA if block in self.held[m]), None)
            if block is None or medium is None:
                break
            found[medium] += size
            parent = block
        return found


@dataclass(frozen=True)
class Placement:
    """An instance's answer: the tokens of the prefix it holds, per medium."""

    instance: str
    tokens: int
    by_medium: dict[str, int]


class KVRouter:
    """Subscribes to ``instances`` (name -> (endpoint, replay endpoint or None))."""

    def __init__(self, instances: dict[str, tuple[str, str | None]]) -> None:
        self.subscribers = {n: KVEventSubscriber(*ends) for n, ends in instances.items()}
        self.indexes = {name: BlockIndex() for name in instances}
        self.batches = 0

    def poll(self, timeout_ms: int = 100) -> int:
        """Apply the batches that arrived (waiting up to ``timeout_ms`` on each instance);
        returns how many."""
        got = 0
        for name, subscriber in self.subscribers.items():
            # nothing new: ask for what a late join missed (a PUB drops what it sends before
            # the subscription reaches it, and a short burst may show no gap afterwards)
            batches = subscriber.poll(timeout_ms) or subscriber.catch_up()
            for _, payload in batches:
                self.indexes[name].apply(payload)
                got += 1
        self.batches += got
        return got

    def route(self, tokens: list[int], cache_salt: str | None = None) -> list[Placement]:
        """Every instance's held prefix of ``tokens``, longest first (ties: more in faster
        media)."""
        answers = []
        for name, index in self.indexes.items():
            by_medium = index.prefix(tokens, cache_salt)
            answers.append(Placement(name, sum(by_medium.values()), by_medium))
        return sorted(answers, key=lambda p: (-p.tokens, *(-p.by_medium[m] for m in MEDIA)))

    def close(self) -> None:
        for subscriber in self.subscribers.values():
            subscriber.close()


def run(router: KVRouter, idle_s: float, limit_s: float) -> None:
    """Poll until ``idle_s`` seconds pass without a batch (after the first) or ``limit_s``."""
    start = last = time.monotonic()
    while time.monotonic() - start < limit_s:
        if router.poll(100):
            last = time.monotonic()
        elif router.batches and time.monotonic() - last > idle_s:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("instances", nargs="+", help="PUB endpoint[,replay endpoint]")
    parser.add_argument("--idle-s", type=float, default=5.0, help="stop after this long idle")
    parser.add_argument("--limit-s", type=float, default=600.0, help="stop after this long")
    args = parser.parse_args()
    ends = {f"instance{i}": (*arg.split(",", 1), None)[:2] for i, arg in enumerate(args.instances)}
    router = KVRouter(ends)  # type: ignore[arg-type]
    try:
        run(router, args.idle_s, args.limit_s)
        for name, index in router.indexes.items():
            counts = {m: len(blocks) for m, blocks in index.held.items()}
            print(f"{name}: {router.subscribers[name].next_seq} batches, blocks held {counts}")
    finally:
        router.close()


if __name__ == "__main__":
    main()

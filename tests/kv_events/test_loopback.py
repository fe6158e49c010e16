"""Over loopback: the decoded stream alone rebuilds the exact block set of every tier (device,
host, file store) after a mixed workload with evictions, storage writes and a reset, and after
a forced gap (through replay); SGLang's own classes decode the same bytes to the same sets."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hicache import HiRadixCache
from hicache.kv_events import KVEventsConfig
from hicache.kv_events.publisher import ZmqEventPublisher
from hicache.kv_events.subscriber import KVEventSubscriber
from hicache.kv_events.wire import block_int, decode_batch
from hicache.radix.events import AllBlocksCleared
from tests.kv_events import sglang_structs as sgl
from tests.radix.hiradix_rig import DIM, HEADS, LAYERS, make_cache
from tests.radix.test_kv_events import Player, tree_state

PAGE = 2
OPS = {"put": 5, "request": 3, "match": 2, "load": 4, "evict": 2, "evict_host": 1, "events": 2}


class Index:
    """A consumer's view: medium -> block ints, from batches decoded by ``decode``."""

    def __init__(self, decode: Callable[[bytes], Any]) -> None:
        self.decode = decode
        self.held: dict[str, set[int]] = {m: set() for m in ("GPU", "CPU_PINNED", "DISK")}
        self.removed_from: set[str] = set()

    def apply(self, payload: bytes) -> None:
        for event in self.decode(payload).events:
            name = type(event).__name__
            if name == "AllBlocksCleared":
                for blocks in self.held.values():
                    blocks.clear()
            elif name == "BlockStored":
                self.held[event.medium].update(event.block_hashes)
            else:
                self.held[event.medium].difference_update(event.block_hashes)
                self.removed_from.add(event.medium)


def store_pages(cache: HiRadixCache, root: Path) -> set[int]:
    """The pages whose every object is in the file store under ``root``."""
    keys = cache.storage_tier.keys  # type: ignore[union-attr]
    parts: dict[str, int] = {}
    for path in root.glob("*/*.bin"):
        page_key = path.name.removesuffix(".bin").rsplit("_", 1)[0]
        parts[page_key] = parts.get(page_key, 0) + 1
    digests = [keys.page_hash(k) for k, n in parts.items() if n == 2]
    return {block_int(d) for d in digests if d is not None}


def truth(cache: HiRadixCache, root: Path) -> dict[str, set[int]]:
    tiers, _ = tree_state(cache)
    return {
        "GPU": {block_int(h) for h in tiers["device"]},
        "CPU_PINNED": {block_int(h) for h in tiers["host"]},
        "DISK": store_pages(cache, root),
    }


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    publisher = ZmqEventPublisher(KVEventsConfig("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
    subscriber = KVEventSubscriber(publisher.endpoint, publisher.replay_endpoint)
    object_bytes = PAGE * LAYERS * HEADS * DIM * 4
    cache = make_cache(
        page_size=PAGE,
        pages=24,
        write_policy="write_through",
        hicache_ratio=1.5,
        event_sink=publisher,
        hicache_storage_backend="file",
        storage_backend_extra_config={"root": str(tmp_path), "max_bytes": 40 * object_bytes},
    )
    yield cache, publisher, subscriber, tmp_path
    cache.close()
    subscriber.close()
    publisher.close()


def play(cache: HiRadixCache, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    player, names, weights = Player(cache, rng), list(OPS), list(OPS.values())
    for _ in range(steps):
        getattr(player, rng.choices(names, weights)[0])()
    cache.drain_transfers()  # storage writes land: their events are published


def catch_up(publisher: ZmqEventPublisher, subscriber: KVEventSubscriber, *views: Index) -> None:
    assert publisher.flush()
    while subscriber.next_seq < publisher.sent_batches:
        for _, payload in subscriber.poll(1000):
            for view in views:
                view.apply(payload)


def test_stream_rebuilds_every_tier_through_reset_and_a_gap(rig: Any) -> None:
    cache, publisher, subscriber, root = rig
    ours, theirs = Index(decode_batch), Index(sgl.decoder.decode)
    play(cache, 0, 300)
    catch_up(publisher, subscriber, ours, theirs)
    expected = truth(cache, root)
    assert ours.held == theirs.held == expected
    assert all(expected.values())  # every tier holds pages
    assert ours.removed_from == {"GPU", "CPU_PINNED", "DISK"}  # evictions from every tier

    cache.reset()  # AllBlocksCleared; the store keeps its pages, so wipe them as well
    cache.storage_tier.storage.clear()  # type: ignore[union-attr]
    play(cache, 1, 150)
    assert publisher.flush()
    replays = subscriber.replays
    assert subscriber.socket.poll(1000)
    subscriber.socket.recv_multipart()  # a batch lost on the way: a forced gap
    catch_up(publisher, subscriber, ours, theirs)
    assert subscriber.replays == replays + 1 and subscriber.missed == 0
    assert ours.held == theirs.held == truth(cache, root)


def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    publisher = ZmqEventPublisher(KVEventsConfig("tcp://127.0.0.1:*", max_queue_size=2))
    subscriber = KVEventSubscriber(publisher.endpoint)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        start = time.monotonic()
        for _ in range(20_000):
            publisher.publish(AllBlocksCleared())
        assert time.monotonic() - start < 2.0
        assert publisher.flush()
        received = 0
        while subscriber.next_seq < publisher.sent_batches:
            received += sum(len(decode_batch(p).events) for _, p in subscriber.poll(1000))
        assert publisher.dropped > 0
        assert received + publisher.dropped == 20_000
    finally:
        subscriber.close()
        publisher.close()
    publisher.publish(AllBlocksCleared())  # after close: dropped and counted, no error
    assert received + publisher.dropped == 20_001

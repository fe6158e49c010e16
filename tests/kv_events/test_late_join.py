"""A subscriber that joins after a burst (no later batch shows it a gap) catches up through the
replay socket, which a closing publisher keeps answering for ``replay_linger_s``."""

from __future__ import annotations

import socket
import threading
import time

from hicache.kv_events import KVEventsConfig
from hicache.kv_events.publisher import ZmqEventPublisher
from hicache.kv_events.subscriber import KVEventSubscriber
from hicache.radix.events import AllBlocksCleared


def _endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_late_subscriber_catches_up_while_the_publisher_closes() -> None:
    config = KVEventsConfig(_endpoint(), _endpoint(), replay_linger_s=2.0)
    publisher = ZmqEventPublisher(config)
    for _ in range(5):  # five batches nobody hears
        publisher.publish(AllBlocksCleared())
        assert publisher.flush()
    closing = threading.Thread(target=publisher.close)
    start = time.monotonic()
    closing.start()
    subscriber = KVEventSubscriber(config.endpoint, config.replay_endpoint)
    try:
        assert subscriber.poll(50) == []  # the burst is over: no gap to notice
        got = subscriber.catch_up(timeout_ms=1000)
        assert [seq for seq, _ in got] == [0, 1, 2, 3, 4]
        assert subscriber.next_seq == 5 and subscriber.missed == 0
    finally:
        subscriber.close()
        closing.join()
    assert time.monotonic() - start >= 1.5  # close() waited out the linger


def test_close_does_not_linger_without_a_replay_socket() -> None:
    publisher = ZmqEventPublisher(KVEventsConfig(_endpoint(), replay_linger_s=5.0))
    start = time.monotonic()
    publisher.close()
    assert time.monotonic() - start < 2.0

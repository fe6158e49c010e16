"""ZmqEventPublisher: KV events over ZMQ in SGLang's format, off the scheduler thread.

``publish`` (the ``EventSink`` call, from any thread) only puts the event in a bounded queue:
when it is full the event is dropped and counted (``dropped``), never waited for. One thread
takes what is waiting (up to ``max_batch_events``), encodes it as one ``KVEventBatch``
(``wire``) and sends the multipart message ``(topic, seq, payload)`` on the PUB socket, ``seq``
an 8-byte big-endian counter from 0; the last ``buffer_steps`` messages are kept. Between
batches the thread answers the ROUTER socket (``replay_endpoint``): a request
``(identity, b"", start)`` (``start`` 8 bytes big-endian, as a DEALER sends ``[b"", start]``)
gets every kept message with ``seq >= start`` as ``(identity, b"", topic, seq, payload)``, then
``(identity, b"", b"", END_SEQ, b"")``, as SGLang's ``ZmqEventPublisher`` answers.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections import deque

import zmq

from hicache.kv_events.config import KVEventsConfig
from hicache.kv_events.wire import encode_batch
from hicache.radix.events import KVEvent

__all__ = ["END_SEQ", "ZmqEventPublisher"]

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_WAIT_S = 0.02  # the thread's longest sleep on an empty queue (replay answers wait this long)


class ZmqEventPublisher:
    """See the module docstring. ``config``: a ``KVEventsConfig``. The sockets are bound (or
    connected) here, so a bad or busy address raises ``OSError`` in the caller.

    Attributes
    ----------
    dropped : events dropped because the queue was full (or published after ``close``).
    endpoint, replay_endpoint : the addresses bound (a ``tcp://host:*`` port resolved).
    """

    def __init__(self, config: KVEventsConfig) -> None:
        if not isinstance(config, KVEventsConfig):
            raise TypeError(f"config must be a KVEventsConfig, got {type(config).__name__}")
        self.config = config
        self.dropped = 0
        self._queue: queue.Queue[KVEvent] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode("utf-8")
        self._seq = 0
        self._stop = threading.Event()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub, self.endpoint = self._socket(zmq.PUB, config.endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if config.replay_endpoint is not None:
            try:
                self._replay, self.replay_endpoint = self._socket(
                    zmq.ROUTER, config.replay_endpoint
                )
            except OSError:
                self._pub.close(linger=0)
                raise
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _socket(self, kind: int, address: str) -> tuple[zmq.Socket[bytes], str]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, self.config.hwm)
        try:
            if self.config.bind or kind == zmq.ROUTER:
                sock.bind(address)
                address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                sock.connect(address)
        except zmq.ZMQError as err:
            sock.close(linger=0)
            raise OSError(f"KV events: cannot use {address}: {err}") from err
        return sock, address

    def publish(self, event: KVEvent) -> None:
        """Queue ``event`` for the thread; drop and count it when the queue is full."""
        if self._stop.is_set():
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            if not self.dropped:
                logger.warning("KV event queue full (%d): dropping events", self._queue.maxsize)
            self.dropped += 1

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued event has been sent (at most ``timeout_s``); whether it
        has."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._queue.unfinished_tasks

    @property
    def sent_batches(self) -> int:
        """Batches sent so far (the next sequence number)."""
        return self._seq

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (for at most ``timeout_s``), answer replay requests for
        ``replay_linger_s`` more, stop the thread and close the sockets, letting ZMQ deliver the
        last messages for up to a second (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout_s + self.config.replay_linger_s)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=1000)
        atexit.unregister(self.close)

    # ---- the publisher thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._answer_replays()
            events = self._take()
            if events:
                self._send(events)
            elif self._stop.is_set():
                break
        deadline = time.monotonic() + (self.config.replay_linger_s if self._replay else 0)
        while time.monotonic() < deadline:  # late subscribers may still ask for what they missed
            self._answer_replays()
            time.sleep(_WAIT_S)

    def _take(self) -> list[KVEvent]:
        """The events waiting (at most ``max_batch_events``), after a short wait for one."""
        try:
            events = [self._queue.get(timeout=_WAIT_S)]
        except queue.Empty:
            return []
        while len(events) < self.config.max_batch_events:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return events

    def _send(self, events: list[KVEvent]) -> None:
        payload = encode_batch(events, time.time(), self.config.attn_dp_rank)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        except zmq.ZMQError as err:  # a subscriber can still replay it
            logger.warning("KV events: send of batch %d failed (%s)", seq, err)
        for _ in events:
            self._queue.task_done()

    def _answer_replays(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("KV events: malformed replay request of %d frames", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    message = (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    self._replay.send_multipart(message)
            self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

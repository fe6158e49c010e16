"""KVEventSubscriber: the consumer side of ``ZmqEventPublisher``, with replay on a gap.

It connects a SUB socket to a publisher (and a DEALER to its replay socket) and hands out the
raw ``(seq, payload)`` messages in sequence order: a message whose sequence number skips ahead
makes it ask the replay socket for everything from the first one missing, so no batch is lost
while the publisher still keeps it (``buffer_steps``); what it no longer keeps is counted in
``missed``. Decoding is the caller's (``wire.decode_batch``, or SGLang's own classes).
"""

from __future__ import annotations

import zmq

__all__ = ["KVEventSubscriber"]

END = -1  # the sequence number of the replay's end marker


class KVEventSubscriber:
    """Subscribes to one publisher.

    Parameters
    ----------
    endpoint : the publisher's PUB address.
    replay_endpoint : its ROUTER address, or None (a gap is then only counted).
    topic : the topic to subscribe to ("": every message).
    replay_timeout_ms : how long a replay may take before the gap is given up.

    Attributes
    ----------
    socket : the SUB socket. next_seq : the sequence number expected next.
    replays : replays asked for; missed : batches lost for good (not kept any more).
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_ms: int = 2000,
    ) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socket: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self.socket.connect(endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(replay_endpoint)
        self.timeout_ms = replay_timeout_ms
        self.next_seq = 0
        self.replays = self.missed = 0

    def poll(self, timeout_ms: int = 0) -> list[tuple[int, bytes]]:
        """The messages that arrived (waiting up to ``timeout_ms`` for the first), gaps filled
        by replay, in sequence order."""
        out: list[tuple[int, bytes]] = []
        wait = timeout_ms
        while self.socket.poll(wait):
            _, seq_bytes, payload = self.socket.recv_multipart()
            self._accept(int.from_bytes(seq_bytes, "big"), payload, out)
            wait = 0
        return out

    def _accept(self, seq: int, payload: bytes, out: list[tuple[int, bytes]]) -> None:
        if seq > self.next_seq:
            out += self._replayed(self.next_seq, seq)
            self.missed += seq - self.next_seq  # what replay did not bring
            self.next_seq = seq
        if seq == self.next_seq:
            out.append((seq, payload))
            self.next_seq += 1

    def catch_up(self, timeout_ms: int = 100) -> list[tuple[int, bytes]]:
        """Ask the replay socket for every batch from ``next_seq`` on (waiting up to
        ``timeout_ms``): what a subscriber that joined late missed, when no later batch arrives
        to show the gap (a publisher's first batches go to no one until the subscription has
        reached it). Empty without a replay socket."""
        return self._replayed(self.next_seq, 1 << 63, timeout_ms)

    def _replayed(
        self, start: int, stop: int, timeout_ms: int | None = None
    ) -> list[tuple[int, bytes]]:
        """Messages ``start .. stop - 1`` that the replay socket still has (``next_seq``
        advanced past them)."""
        if self._replay is None:
            return []
        self.replays += 1
        self._replay.send_multipart((b"", start.to_bytes(8, "big")))
        got: list[tuple[int, bytes]] = []
        while self._replay.poll(self.timeout_ms if timeout_ms is None else timeout_ms):
            frames = self._replay.recv_multipart()
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END:
                break
            if self.next_seq <= seq < stop:  # from the first the buffer still has
                self.missed += seq - self.next_seq
                got.append((seq, frames[3]))
                self.next_seq = seq + 1
        return got

    def close(self) -> None:
        for sock in (self.socket, self._replay):
            if sock is not None:
                sock.close(linger=0)

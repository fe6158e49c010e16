"""The KV event publisher's settings, and their check (``check_kv_events``)."""

from __future__ import annotations

from dataclasses import dataclass

from hicache.checks import check_int
from hicache.radix.events import EventSink

__all__ = ["SCHEMES", "KVEventsConfig", "check_kv_events"]

SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class KVEventsConfig:
    """Where and how ``ZmqEventPublisher`` publishes (SGLang's ``KVEventsConfig`` fields).

    Attributes
    ----------
    endpoint : the PUB socket's address (``tcp://host:port``, ``ipc://path``, ``inproc://x``).
    replay_endpoint : the ROUTER socket answering replay requests, or None (no replay).
    bind : bind both sockets (True: subscribers connect to us) or connect the PUB socket.
    topic : the first frame of every message (subscribers filter on it).
    buffer_steps : batches kept for replay (the oldest are forgotten first).
    max_queue_size : events waiting for the publisher thread; past it an event is dropped and
        counted (``ZmqEventPublisher.dropped``), never waited for.
    max_batch_events : events per batch at most (a batch is what the thread finds waiting).
    hwm : ZMQ's send high-water mark of the PUB socket (messages).
    attn_dp_rank : the rank named in every batch (SGLang's data-parallel attention rank).
    replay_linger_s : seconds ``close()`` keeps answering replay requests after the last batch
        is sent, so a subscriber that joined late (a PUB socket drops what it sends before a
        subscription arrives) can still fetch what it missed; 0 with no replay socket.
    """

    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    bind: bool = True
    topic: str = ""
    buffer_steps: int = 10_000
    max_queue_size: int = 100_000
    max_batch_events: int = 1024
    hwm: int = 100_000
    attn_dp_rank: int = 0
    replay_linger_s: float = 1.0

    def __post_init__(self) -> None:
        _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_endpoint("replay_endpoint", self.replay_endpoint)
            if self.replay_endpoint == self.endpoint and not self.endpoint.endswith(":*"):
                raise ValueError("replay_endpoint must differ from endpoint (or be port *)")
        if not isinstance(self.bind, bool):
            raise TypeError(f"bind must be a bool, got {type(self.bind).__name__}")
        if not isinstance(self.topic, str):
            raise TypeError(f"topic must be a str, got {type(self.topic).__name__}")
        for name in ("buffer_steps", "max_queue_size", "max_batch_events", "hwm"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("attn_dp_rank", self.attn_dp_rank)
        linger = self.replay_linger_s
        if isinstance(linger, bool) or not isinstance(linger, (int, float)) or not linger >= 0:
            raise ValueError(f"replay_linger_s must be a number >= 0, got {linger!r}")


def _check_endpoint(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value.startswith(SCHEMES) or value in SCHEMES:
        raise ValueError(f"{name} must be a ZMQ address starting with {SCHEMES}, got {value!r}")


def check_kv_events(kv_events: object) -> KVEventsConfig | EventSink | None:
    """``kv_events`` as a ``KVEventsConfig`` (from an endpoint str), a sink or None, checked
    (``TypeError``/``ValueError`` as ``make_sink``); nothing is built."""
    if isinstance(kv_events, str):
        return KVEventsConfig(endpoint=kv_events)
    if kv_events is None or isinstance(kv_events, KVEventsConfig):
        return kv_events
    if callable(getattr(kv_events, "publish", None)):
        return kv_events  # type: ignore[return-value]
    raise TypeError(
        "kv_events must be None, an endpoint str, a KVEventsConfig or an EventSink, "
        f"got {type(kv_events).__name__}"
    )

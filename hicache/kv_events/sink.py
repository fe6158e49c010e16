"""``make_sink``: a ``kv_events`` setting turned into the ``EventSink`` a cache publishes to."""

from __future__ import annotations

from hicache.kv_events.config import KVEventsConfig, check_kv_events
from hicache.radix.events import EventSink

__all__ = ["make_sink"]


def make_sink(kv_events: object) -> EventSink | None:
    """The ``EventSink`` a ``kv_events`` setting names: None for None, a new
    ``ZmqEventPublisher`` for an endpoint (str) or a ``KVEventsConfig`` (its sockets bound
    now; the caller closes it), ``kv_events`` itself when it has a ``publish`` method.

    ``TypeError`` for anything else, ``ValueError`` for a bad endpoint, ``ImportError`` naming
    the extra without pyzmq/msgspec, ``OSError`` when an address cannot be bound.
    """
    checked = check_kv_events(kv_events)
    if not isinstance(checked, KVEventsConfig):
        return checked
    try:
        from hicache.kv_events.publisher import ZmqEventPublisher
    except ImportError as err:
        raise ImportError(
            f"KV events on the wire need pyzmq and msgspec: pip install 'hicache[events]' ({err})"
        ) from err
    return ZmqEventPublisher(checked)

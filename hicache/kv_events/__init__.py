"""KV events on the wire: SGLang's ZMQ format (``pip install 'hicache[events]'``).

``KVEventsConfig`` and ``make_sink`` need no extra; ``wire`` (msgspec), ``publisher`` and
``subscriber`` (pyzmq) import their packages when first used.
"""

from hicache.kv_events.config import KVEventsConfig, make_sink

__all__ = ["KVEventsConfig", "make_sink"]

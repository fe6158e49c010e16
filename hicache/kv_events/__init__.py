"""KV events on the wire: SGLang's ZMQ format (``pip install 'hicache[events]'``).

``KVEventsConfig`` (``config``) and ``make_sink`` (``sink``) need no extra; ``wire``
(msgspec), ``publisher`` and ``subscriber`` (pyzmq) import their packages when first used.
"""

from hicache.kv_events.config import KVEventsConfig
from hicache.kv_events.sink import make_sink

__all__ = ["KVEventsConfig", "make_sink"]

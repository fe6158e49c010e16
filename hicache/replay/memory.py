"""What a replay holds in RAM: the pools' KV bytes, the tree's bytes and the process's peak.

The bound the replay is held to: its peak resident memory within 2x of the KV bytes its pools
hold (device + host) plus the tree (``peak_over_held <= 2``). The RSS it started with (the
interpreter, torch: about 0.25 GB) counts in the peak, so small pools cannot meet it.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from hicache.stack import KVStack

# ru_maxrss is KiB on Linux, bytes on macOS
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def rss_bytes() -> int:
    """This process's resident memory now."""
    return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far: ``getrusage``'s ``ru_maxrss``, or the RSS
    now where that is larger (the kernel's per-thread counters lag by a few pages)."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT, rss_bytes())


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes: the RSS before the replay built anything (``start``), the process's peak at its
    end (``peak``; over the whole process, so a sweep's later points include earlier ones),
    the pools' KV buffers and the tree (keys, slot arrays and node objects)."""

    start: int
    peak: int
    device_kv: int
    host_kv: int
    tree: int

    @property
    def held(self) -> int:
        """KV of the pools plus the tree: what the replay must hold."""
        return self.device_kv + self.host_kv + self.tree

    def to_dict(self) -> dict[str, float]:
        gb = 1e9
        return {
            "peak_rss_gb": self.peak / gb,
            "start_rss_gb": self.start / gb,
            "kv_device_gb": self.device_kv / gb,
            "kv_host_gb": self.host_kv / gb,
            "tree_gb": self.tree / gb,
            "peak_over_held": self.peak / self.held if self.held else 0.0,
        }


def _kv_bytes(pool: Any) -> int:
    if pool is None:  # a model of linear layers only
        return 0
    sizes = pool.get_kv_size_bytes()  # (K, V) for MHA pools, one int for MLA
    return int(sum(sizes)) if isinstance(sizes, tuple) else int(sizes)


def _host_bytes(stack: KVStack) -> int:
    controller = getattr(stack.cache, "cache_controller", None)
    if controller is None:
        return 0
    host = controller.mem_pool_host
    parts = getattr(host, "host_parts", None)  # a hybrid model's: one pool per kind of layer
    return int(host.size * host.slot_bytes) if parts is None else sum(int(p.nbytes) for p in parts)


def _base(array: np.ndarray) -> np.ndarray:
    """The array owning ``array``'s buffer (a node's key may view a longer prompt)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def tree_bytes(stack: KVStack) -> int:
    """Bytes the cache's tree holds: every node's key buffer (counted once when shared), slot
    arrays, page hashes, and the node and its children dict."""
    buffers: dict[int, int] = {}
    total = 0
    for node in stack.cache.tree.nodes():
        key = _base(node.key)
        buffers[id(key)] = key.nbytes
        for slots in (node.slots, node.host_slots):
            total += 0 if slots is None else int(slots.nbytes)
        total += 0 if node.hash_value is None else sum(map(sys.getsizeof, node.hash_value))
        total += sys.getsizeof(node) + sys.getsizeof(node.children)
    return total + sum(buffers.values())


def measure(stack: KVStack, start: int) -> MemoryFigures:
    """The figures of a replay on ``stack`` that started at ``start`` bytes of RSS."""
    return MemoryFigures(
        start,
        max(peak_rss_bytes(), start),
        _kv_bytes(stack.kv_pool),
        _host_bytes(stack),
        tree_bytes(stack),
    )

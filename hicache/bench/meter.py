"""Count what a cache moves and evicts, by wrapping a few methods of one cache instance.

The bench needs numbers the cache does not keep: bytes copied each way, how long the copies
took, tokens evicted from each tier. ``TransferMeter`` shadows ``evict``/``evict_host`` of the
cache and the two transfer methods of its host pool with counting wrappers set on those
*instances* (the classes are untouched), so every internal call is seen too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from hicache.devices import is_cuda
from hicache.radix import HiRadixCache, RadixCache


class _Timer:
    """Busy time of transfers issued on the current stream: CUDA events, or wall time on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.cpu_s = 0.0

    def time(self, fn: Callable[[], None]) -> None:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            self.cpu_s += time.perf_counter() - start
            return
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        fn()
        ended.record()
        self.pairs.append((began, ended))

    def seconds(self) -> float:
        """Total busy time; synchronizes the events recorded so far (call after the run)."""
        for _, end in self.pairs:
            end.synchronize()
        return self.cpu_s + sum(s.elapsed_time(e) for s, e in self.pairs) / 1e3


class TransferMeter:
    """Counters for one cache: ``h2d_bytes``/``d2h_bytes``, busy seconds each way, and
    ``device_evicted``/``host_evicted`` tokens."""

    def __init__(self, cache: RadixCache) -> None:
        self.h2d_bytes = self.d2h_bytes = 0
        self.device_evicted = self.host_evicted = 0
        cuda = is_cuda(cache.device)
        self._h2d, self._d2h = _Timer(cuda), _Timer(cuda)
        self._wrap_evict(cache, "evict", "device_evicted")
        self._wrap_evict(cache, "evict_host", "host_evicted")  # a no-op hook without a host tier
        if isinstance(cache, HiRadixCache):
            self._wrap_host_pool(cache.cache_controller.mem_pool_host)

    def h2d_seconds(self) -> float:
        return self._h2d.seconds()

    def d2h_seconds(self) -> float:
        return self._d2h.seconds()

    def _wrap_evict(self, cache: RadixCache, name: str, counter: str) -> None:
        method = getattr(cache, name)

        @functools.wraps(method)
        def counted(num_tokens: int) -> int:
            freed = method(num_tokens)
            setattr(self, counter, getattr(self, counter) + freed)
            return freed

        setattr(cache, name, counted)

    def _wrap_host_pool(self, host: Any) -> None:
        load, backup = host.load_to_device_per_layer, host.backup_from_device_all_layer
        token_layer_bytes = host.item_size * host.parts

        def metered_load(pool: Any, h: torch.Tensor, d: torch.Tensor, layer: int, io: str) -> None:
            self._h2d.time(lambda: load(pool, h, d, layer, io))
            self.h2d_bytes += h.numel() * token_layer_bytes

        def metered_backup(pool: Any, h: torch.Tensor, d: torch.Tensor, io: str) -> None:
            self._d2h.time(lambda: backup(pool, h, d, io))
            self.d2h_bytes += h.numel() * token_layer_bytes * host.layer_num

        host.load_to_device_per_layer = metered_load
        host.backup_from_device_all_layer = metered_backup

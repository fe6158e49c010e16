"""MambaPoolHost: the host (L2) pool of recurrent states, one slot per state.

SGLang's ``MambaPoolHost`` (``mem_cache/pool_host/mamba.py``) keeps a page_first host buffer per
state tensor. Here a host slot is one flat row of bytes holding the whole state (every state
tensor, every layer; order in :mod:`hicache.pools.state_copies`), so the storage tier can store
it as one object (:meth:`MambaPoolHost.page_bytes`, :meth:`MambaPoolHost.load_bytes`) and a
transfer is one batch of copies per state tensor, on the current stream.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from hicache.checks import check_index_tensor, check_int
from hicache.devices import EventLike, current_stream, host_copy, is_cuda, new_event
from hicache.pools.host_layouts import check_ram, host_slots
from hicache.pools.host_memory import pin_buffer, unpin_chunks
from hicache.pools.mamba_pool import MambaPool
from hicache.pools.mamba_slots import INDEX_DTYPES, MambaSlots, index_tensor
from hicache.pools.state_copies import (
    StateSection,
    copy_runs,
    engine_for,
    flat_bytes,
    offsets,
    sections,
)

_CPU = torch.device("cpu")
_PARAMS = ("layers", "conv", "temporal", "conv_dtype", "temporal_dtype")


class MambaPoolHost:
    """Host copies of recurrent states: slots ``1 .. size`` (as the device pool's; no pad slot
    here), each ``slot_bytes = cache_params.mamba_cache_per_req`` bytes.

    Parameters
    ----------
    device_pool : the :class:`MambaPool` whose states this pool backs up (params taken from
        it; the speculative buffers are not carried).
    size : host slots (int >= 1); or
    host_size_gb : host pool size in GB (1e9 bytes), when ``size`` is not given.
    pin_memory : page-lock the buffer (``host_memory.pin_buffer``) when ``device_pool`` is on
        CUDA, so transfers are asynchronous and run on the copy engines.

    A fresh slot's bytes are undefined until a backup or :meth:`load_bytes` writes them. Slot
    arguments are 1-D int64 (or int32) tensors, on any device (a CUDA tensor without a known
    host copy is read back: a sync); bad ones raise ``TypeError`` / ``ValueError`` /
    ``IndexError`` naming the argument, before any change. ``close()`` unpins (also on GC).
    """

    def __init__(
        self,
        device_pool: MambaPool,
        *,
        size: int | None = None,
        host_size_gb: float = 0.0,
        pin_memory: bool = True,
    ) -> None:
        if not isinstance(device_pool, MambaPool):
            raise TypeError(f"device_pool must be a MambaPool, got {type(device_pool).__name__}")
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be a bool, got {type(pin_memory).__name__}")
        self.cache_params = device_pool.cache_params
        self.sections: list[StateSection] = sections(device_pool.state_tensors)
        self.slot_bytes = sum(s.nbytes for s in self.sections)
        self.size = _slot_count(device_pool.size, size, host_size_gb, self.slot_bytes)
        check_ram(self.size * self.slot_bytes)
        self.device = _CPU
        self._slots = MambaSlots(self.size)
        self._buffer = torch.empty((self.size, self.slot_bytes), dtype=torch.uint8)
        self.pinned = pin_memory and is_cuda(device_pool.device)
        self._unpin = self._pin() if self.pinned else None
        self.closed = False

    def _pin(self) -> weakref.finalize[Any, Any]:
        # Every copy lies inside one row, so chunks cut at row multiples are never crossed.
        chunks, _ = pin_buffer(self._buffer, self.slot_bytes)
        return weakref.finalize(self, unpin_chunks, chunks)

    def close(self) -> None:
        """Release the pinned registration (idempotent); later transfers raise RuntimeError."""
        if self._unpin is not None:
            self._unpin()
        self.pinned = False
        self.closed = True

    # -- slots -----------------------------------------------------------------------------

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` host slots (1-D int64, CPU), or None (nothing taken) when fewer are
        free."""
        slots = self._slots.take(need_size)
        return None if slots is None else index_tensor(slots, _CPU)

    def free(self, slots: torch.Tensor) -> None:
        """Give back distinct allocated slots. A pending transfer that reads or writes them must
        have completed (its event) before they are handed out again."""
        self._slots.release(self._slots.allocated("slots", slots))

    def available_size(self) -> int:
        return self._slots.available_size()

    def is_allocated(self, slot: int) -> bool:
        return self._slots.is_allocated(slot)

    def clear(self) -> None:
        """Every slot free (bytes are left as they are)."""
        self._slots.clear()

    def check_invariants(self) -> None:
        """``RuntimeError`` when the free list and the allocated set disagree."""
        self._slots.check_invariants()

    def mem_usage_bytes(self) -> int:
        """Bytes of the host buffer (``size * slot_bytes``)."""
        return self._buffer.nbytes

    # -- transfers --------------------------------------------------------------------------

    def backup_from_device(
        self, device_pool: MambaPool, device_slots: torch.Tensor, host_slots: torch.Tensor
    ) -> EventLike:
        """Copy the states of ``device_slots`` into ``host_slots`` (every layer of every state
        tensor), queued on the device's current stream, non-blocking into pinned memory.

        Both are equally long, distinct and allocated in their pools. Returns an event recorded
        on that stream after the copies: a CPU reader of the host slots (:meth:`page_bytes`)
        must ``synchronize()`` it first; work later on the stream is ordered after them.
        ``ValueError`` when ``device_pool`` does not match (:meth:`mismatch`).
        """
        dev, host = self._prepare(device_pool, device_slots, host_slots)
        engine = engine_for(device_pool.device, self.pinned)
        for section, info in zip(self.sections, device_pool.state_tensors, strict=True):
            dev_off, host_off = offsets(section, info.tensor.shape[1], dev, host)
            src = flat_bytes(info.tensor)
            copy_runs(self.flat, src, host_off, dev_off, section.row_bytes, engine)
        return _recorded(device_pool.device)

    def load_to_device(
        self, device_pool: MambaPool, host_slots: torch.Tensor, device_slots: torch.Tensor
    ) -> EventLike:
        """Overwrite the states of ``device_slots`` with those in ``host_slots`` (checked as in
        :meth:`backup_from_device`), queued on the device's current stream.

        Forward passes later on that stream see the states; other streams ``wait`` on the
        returned event. The host slots must not be written (``load_bytes``, a backup) or freed
        for reuse until the event has completed.
        """
        dev, host = self._prepare(device_pool, device_slots, host_slots)
        engine = engine_for(device_pool.device, self.pinned)
        for section, info in zip(self.sections, device_pool.state_tensors, strict=True):
            dev_off, host_off = offsets(section, info.tensor.shape[1], dev, host)
            dst = flat_bytes(info.tensor)
            copy_runs(dst, self.flat, dev_off, host_off, section.row_bytes, engine)
        return _recorded(device_pool.device)

    def _prepare(
        self, device_pool: MambaPool, device_slots: Any, host_slots: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Checks; then the device slots and the host rows' byte offsets (int64 numpy)."""
        if self.closed:
            raise RuntimeError("this host pool is closed")
        self._check_device_pool(device_pool)
        dev = _values("device_slots", device_slots)
        host = _values("host_slots", host_slots)
        if dev.size != host.size:
            raise ValueError(
                f"device_slots ({dev.size}) and host_slots ({host.size}) must be equally long"
            )
        device_pool.check_allocated("device_slots", dev.tolist())
        self._slots.check_values("host_slots", host.tolist())
        return dev, (host - 1) * self.slot_bytes

    def mismatch(self, device_pool: MambaPool) -> list[str]:
        """How ``device_pool``'s state differs from this pool's (a query): entries such as
        ``"temporal: host pool (2, 3, 5), device pool (2, 3, 4)"``."""
        ours, theirs = self.cache_params, device_pool.cache_params
        return [
            f"{name}: host pool {getattr(ours, name)}, device pool {getattr(theirs, name)}"
            for name in _PARAMS
            if getattr(ours, name) != getattr(theirs, name)
        ]

    def _check_device_pool(self, device_pool: Any) -> None:
        if not isinstance(device_pool, MambaPool):
            raise TypeError(f"device_pool must be a MambaPool, got {type(device_pool).__name__}")
        differences = self.mismatch(device_pool)
        if differences:
            raise ValueError(
                "device_pool does not match the pool this host pool was built for: "
                + "; ".join(differences)
            )

    # -- one state as bytes (the storage tier's object) --------------------------------------

    @property
    def flat(self) -> torch.Tensor:
        """The whole buffer as 1-D uint8 (slot ``s`` at ``(s - 1) * slot_bytes``)."""
        return self._buffer.view(-1)

    def page_bytes(self, slot: int) -> torch.Tensor:
        """Allocated slot ``slot``'s state: a 1-D uint8 CPU view of ``slot_bytes`` bytes (no
        copy: it changes when the slot is written; ``.numpy()`` is a buffer, ``bytes(...)`` of
        that a copy), laid out as :mod:`hicache.pools.state_copies` says. After a backup,
        synchronize its event first."""
        return self._buffer[self._row("slot", slot)]

    def load_bytes(self, slot: int, data: torch.Tensor | bytes | bytearray | memoryview) -> None:
        """Write a state exported by :meth:`page_bytes` (of a pool with equal params) into
        allocated slot ``slot``: ``data`` a 1-D uint8 CPU tensor or a bytes-like object of
        exactly ``slot_bytes`` bytes (``ValueError`` otherwise, before any change)."""
        row = self._row("slot", slot)
        if isinstance(data, torch.Tensor):
            check_index_tensor("data", data, (torch.uint8,))
            if data.device.type != "cpu":
                raise ValueError(f"data must be a CPU tensor, got one on {data.device}")
            source = data.numpy()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            source = np.frombuffer(data, dtype=np.uint8)
        else:
            raise TypeError(f"data must be a uint8 tensor or bytes-like, got {type(data).__name__}")
        if source.size != self.slot_bytes:
            raise ValueError(f"data must be {self.slot_bytes} bytes, got {source.size}")
        self._buffer[row].numpy()[:] = source

    def _row(self, name: str, slot: int) -> int:
        check_int(name, slot)
        self._slots.check_values(name, [slot])
        return slot - 1


def _values(name: str, slots: Any) -> np.ndarray:
    """``slots`` (checked to be a 1-D int64/int32 tensor) as int64 numpy on the CPU."""
    tensor = check_index_tensor(name, slots, INDEX_DTYPES)
    return host_copy(tensor).to(torch.int64).numpy()


def _recorded(device: torch.device) -> EventLike:
    event = new_event(device)
    event.record(current_stream(device))
    return event


def _slot_count(device_size: int, size: int | None, host_size_gb: float, slot_bytes: int) -> int:
    """Host slots from ``size`` or ``host_size_gb`` (exactly one given)."""
    if size is not None:
        if host_size_gb != 0:
            raise ValueError(f"give size or host_size_gb, not both (got {size}, {host_size_gb})")
        return check_int("size", size, minimum=1)
    if not host_size_gb:
        raise ValueError("give size (host slots) or host_size_gb (> 0)")
    return host_slots(device_size, 0.0, host_size_gb, 1, slot_bytes)

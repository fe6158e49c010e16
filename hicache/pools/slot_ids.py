"""Device slot ids without a copy: a run of consecutive ids is a view of the ids kept on the
device.

On CUDA an allocation hands its slots out as a device tensor. Copying them there costs a pinned
staging copy and a host-to-device copy (~16-25 us of CPU on the H100 host). Slots that form one
ascending run, which is what the allocator hands out from a free run and what most tree nodes
hold, are instead a slice of ``arange(size)`` kept on the device: one view (~3 us), no copy, no
upload. The kept ids cost 8 bytes per slot of device memory, made on the first such view, and
are kept only for pools of at most ``KEPT_MAX`` slots (32 MiB): a larger pool copies its ids.
Like every slot tensor hicache hands out, a view is read-only for its users: writing into it
would change the ids later views hand out (SGLang's allocator hands out views of its free list
under the same rule).
"""

from __future__ import annotations

import torch

from hicache.devices import HOST_COPY, to_device

KEPT_MAX = 1 << 22  # slots of the largest pool whose ids are kept on the device


class SlotIds:
    """Slot ids ``0 .. size - 1`` on ``device`` (CUDA, ``size <= KEPT_MAX``: kept there once
    needed)."""

    def __init__(self, size: int, device: torch.device | str) -> None:
        self.size, self.device = size, torch.device(device)
        self._keep = self.device.type == "cuda" and size <= KEPT_MAX
        self._kept: torch.Tensor | None = None

    def on_device(self, host: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        """``host`` (1-D int64 CPU slot ids) on ``device`` (default: the ids' device),
        carrying ``host`` as its CPU copy (``devices.host_copy``): a view of the kept ids when
        they are one ascending run within ``[0, size)`` on the ids' device, else one
        non-blocking copy (``devices.to_device``). On the CPU, ``host`` itself."""
        if device is not None and device != self.device:
            return to_device(host, device)
        if not self._keep or not host.numel():
            return to_device(host, self.device)
        ids = host.numpy()
        first, n = int(ids[0]), ids.size
        if not (0 <= first and first + n <= self.size and int(ids[-1]) == first + n - 1):
            return to_device(host, self.device)
        if n > 2 and not (ids[1:] - ids[:-1] == 1).all():  # ends agree: the middle must too
            return to_device(host, self.device)
        if self._kept is None:
            self._kept = torch.arange(self.size, dtype=torch.int64, device=self.device)
        out = self._kept[first : first + n]
        setattr(out, HOST_COPY, host)
        return out

"""``io_backend="auto"``: per batch, the copy engines for long runs, the transfer kernel otherwise.

A direct (copy-engine) copy costs the CPU about 0.5-1.5 us to issue whatever its size, and the
engines reach the line rate (about 55 GB/s on an H200) once each copy is 64 KiB or more; the
SM kernel moves any scattered batch at about 0.9 of that with one launch (benchmarks/RESULTS.md).
A direct call also has a fixed CPU cost (about 0.2 ms per op call in ``bench_transfer.py``)
that a small batch cannot hide. So a batch goes to the engines when its mean run of consecutive
slots, times the bytes of one slot in one layer, is at least :data:`ENGINE_MIN_RUN_BYTES` *and*
one layer of one part (K, V or the MLA latent) is at least :data:`ENGINE_MIN_BATCH_BYTES`; to the
kernel otherwise. On the H200 (benchmarks/RESULTS.md, issue 15) this picks the faster of the two
in wall time on every cell of ``bench_transfer.py``: the kernel at page 1 and for 32 KiB runs,
and for 1k-token batches (2 MiB per part: the kernel 0.12 ms a layer, the engines 0.27 ms); the
engines from 64 KiB runs and 4 MiB per part (0.96-1.00 of the wire against the kernel's 0.88-0.90).
Where the host layout has one backend only (page_first, page_head: kernel; page_first_direct:
direct), "auto" is that backend.

Runs are counted on CPU index tensors only. A batch whose device indices are only on the GPU
goes to the kernel: the engines plan on the CPU, and copying the indices there would make the
caller wait for the GPU. Loads carry the
allocator's CPU copy of their slots, and write batches the pinned copy the controller stages
without waiting (``transfer_indices.fetch_indices``), so both can use the engines.
"""

from __future__ import annotations

import torch

from hicache.pools.host_layouts import SUPPORTED_PAIRS

AUTO = "auto"
ENGINE_MIN_RUN_BYTES = 64 * 1024
ENGINE_MIN_BATCH_BYTES = 4 * 1024 * 1024
CONCRETE = ("kernel", "direct")


def mean_run(host_indices: torch.Tensor, device_indices: torch.Tensor) -> float:
    """Mean length (slots) of the runs where both index tensors step by one. Indices: equally
    long 1-D int64 CPU tensors."""
    n = host_indices.numel()
    if n < 2:
        return float(max(n, 1))
    h, d = host_indices.numpy(), device_indices.numpy()
    breaks = int(((h[1:] != h[:-1] + 1) | (d[1:] != d[:-1] + 1)).sum())
    return n / (breaks + 1)


def resolve(
    io_backend: str,
    layout: str,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor | None,
    item_size: int,
) -> str:
    """The concrete backend (``"kernel"`` or ``"direct"``) one batch runs with: ``io_backend``
    itself unless it is ``"auto"``; then the rule of the module for ``layout``, a slot of
    ``item_size`` bytes per layer and part, and ``device_indices`` on the CPU (None or on the GPU:
    not readable without a wait). Never waits for the GPU."""
    if io_backend != AUTO:
        return io_backend
    able = [b for b in CONCRETE if layout in SUPPORTED_PAIRS[b]]
    if len(able) == 1:
        return able[0]
    if device_indices is None or host_indices.is_cuda or device_indices.is_cuda:
        return "kernel"
    if host_indices.numel() * item_size < ENGINE_MIN_BATCH_BYTES:
        return "kernel"
    run_bytes = mean_run(host_indices, device_indices) * item_size
    return "direct" if run_bytes >= ENGINE_MIN_RUN_BYTES else "kernel"

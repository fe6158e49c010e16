"""Calling the transfer kernel's compiled form directly, without Triton's per-launch binding.

Triton's runner (``kernel[grid](*args)``) binds the arguments, computes the specialization key
and looks the compiled kernel up on every launch (~25-80 us of CPU on the H100 host). A launch
whose kernel is already known calls the compiled kernel's launcher instead (:func:`direct`). A
compiled kernel serves any launch with the same constants (a :class:`~hicache.kernels.
triton_ops.Prepared`), launch options and specialization of the non-constant arguments: the
two index tensors' dtype and 16-byte alignment, and each int argument's integer type (every
int argument is ``do_not_specialize``, so its value is not specialized on): :func:`spec_key`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
from triton.compiler import CompiledKernel

from hicache.devices import raw_stream

SpecKey = tuple[object, ...]


def int_class(value: int) -> int:
    """Which integer type Triton gives an int argument (i32, i64 or u64)."""
    return 0 if -(2**31) <= value < 2**31 else 1 if value < 2**63 else 2


def spec_key(src: torch.Tensor, dst: torch.Tensor, n_rows: int) -> SpecKey:
    """What Triton specializes the kernel on among a launch's per-batch arguments."""
    return (src.dtype, src.data_ptr() % 16 == 0, dst.dtype, dst.data_ptr() % 16 == 0,
            int_class(n_rows))  # fmt: skip


def _hooked(hook: object) -> bool:
    """Whether a launch hook is set: a callable, or a chain of them (Triton >= 3.5) not empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


def hooked() -> bool:
    """Whether a Triton launch hook (a profiler) is set now."""
    hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
    names = ("launch_enter_hook", "launch_exit_hook")
    return any(_hooked(getattr(hooks, name, None)) for name in names)


def _no_stream(index: int) -> int:
    return 0  # a stand-in kernel on CPU tensors (tests): no stream


def direct(
    kernel: CompiledKernel, grid: tuple[int, int, int], device: torch.device
) -> Callable[..., None]:
    """``kernel[grid]`` without the runner's per-launch lookups: its launcher called with the
    raw handle of ``device``'s current stream, read at every launch, as Triton's runner calls
    it. The runner itself when ``kernel`` lacks those parts, or when a launch hook (a profiler)
    is set at bind time: the hooks then see every launch."""
    runner: Callable[..., None] = kernel[grid]
    if hooked():
        return runner
    try:
        launch, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
    except AttributeError:
        return runner
    x, y, z = grid
    stream_of = raw_stream if device.type == "cuda" else _no_stream
    index = 0 if device.index is None else device.index

    def run(*args: object) -> None:
        launch(x, y, z, stream_of(index), function, metadata, None, None, None, *args)

    return run

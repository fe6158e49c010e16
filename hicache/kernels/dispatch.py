"""Run a validated plan on the right backend: Triton on CUDA, the torch reference on the CPU.

``force_backend`` is the internal entry tests use to run the Triton kernels on CPU tensors under
``TRITON_INTERPRET=1`` (or the reference on CUDA tensors); the public ops never take a backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from hicache import env
from hicache.kernels import reference
from hicache.kernels.layouts import CopyPlan
from hicache.kernels.validate import check_launch

BACKENDS = ("reference", "triton")
_forced: ContextVar[str | None] = ContextVar("hicache_kernel_backend", default=None)


@contextlib.contextmanager
def force_backend(name: str) -> Iterator[None]:
    """Within the block, every non-direct op runs on backend ``name`` ("reference" or "triton")."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


def forced_backend() -> str | None:
    """The backend an enclosing :func:`force_backend` block forces, else None."""
    return _forced.get()


def execute(plan: CopyPlan, block_quota: object, num_warps_per_block: object) -> None:
    """Check the launch arguments, then copy: Triton when ``plan.device`` is CUDA."""
    check_launch(block_quota, num_warps_per_block)
    assert isinstance(block_quota, int) and isinstance(num_warps_per_block, int)
    run(plan, block_quota, num_warps_per_block)


def backend_for(plan: CopyPlan) -> str:
    """The backend that runs ``plan`` here: the forced one, else Triton on CUDA."""
    backend = _forced.get() or ("triton" if plan.device.type == "cuda" else "reference")
    assert backend == "reference" or plan.device.type == "cuda" or env.ENV.triton_interpret, (
        "Triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
    )
    return backend


def run(plan: CopyPlan, block_quota: int, num_warps_per_block: int) -> None:
    """Copy a validated ``plan`` whose launch arguments passed ``check_launch``: no checks."""
    if backend_for(plan) == "reference":
        reference.run(plan)
    else:
        from hicache.kernels import triton_ops  # imports Triton: only when it runs

        triton_ops.launch(plan, block_quota, num_warps_per_block)

"""Test-wide setup: without a GPU, Triton kernels run in the CPU interpreter.

TRITON_INTERPRET must be set before any ``@triton.jit`` decorator runs, so it is set here, before
the tests import hicache; so is HICACHE_CHECK_THREADS (the wrong-thread guard, read when the
guarded classes are defined): every test runs with it on.
"""

import os

os.environ.setdefault("HICACHE_CHECK_THREADS", "1")

import torch  # noqa: E402 (after the switches hicache reads at import)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Tiny CPU tests: one torch thread avoids oversubscribing small shared CI machines.
    torch.set_num_threads(1)

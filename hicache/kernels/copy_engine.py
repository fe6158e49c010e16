"""Batched memory copies on the GPU's copy engines: no SMs, the PCIe line rate on long runs.

The direct ops hand over their runs as three equally long arrays (destination addresses, source
addresses, byte counts) and :func:`copy_batch` queues them all on the current CUDA stream, in one
``cudaMemcpyBatchAsync`` call (CUDA runtime >= 12.8). The batch call rejects the legacy default
stream, and older runtimes lack it: there, one ``cudaMemcpyAsync`` per copy (same bytes, more
CPU time). Measured on an H200 (benchmarks/RESULTS.md): copies of >= 64 KiB run at the contiguous
copy's rate in both directions and ~98 GB/s both ways at once, leaving the SMs to the model;
copies of a few KiB run at a few GB/s, which is why the SM kernels serve scattered token slots.

CUDA only: the CPU build never loads the runtime library, and :func:`available` says whether
this build can (ROCm builds and missing runtimes fall back to ``copy_`` in the direct ops).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import site
from dataclasses import dataclass

import numpy as np
import torch

_SRC_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the (unified) addresses
_BATCH_MIN_VERSION = 12080  # cudaMemcpyBatchAsync appeared in CUDA 12.8
_NO_FAIL_INDEX_VERSION = 13000  # CUDA 13 dropped its failIdx argument


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _Attributes(ctypes.Structure):
    _fields_ = [
        ("src_access_order", ctypes.c_int),
        ("src_loc_hint", _Location),
        ("dst_loc_hint", _Location),
        ("flags", ctypes.c_uint),
    ]


@dataclass(frozen=True)
class _Runtime:
    lib: ctypes.CDLL
    version: int

    @property
    def has_batch(self) -> bool:
        return self.version >= _BATCH_MIN_VERSION


def open_cudart() -> ctypes.CDLL:
    """The CUDA runtime torch uses (what :func:`available` loads once): by soname (torch has it
    loaded), else from the nvidia wheels."""
    major = (torch.version.cuda or "").split(".")[0]
    names = [f"libcudart.so.{major}"] if major else []
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    names += sorted(
        p
        for root in roots
        for p in glob.glob(os.path.join(root, "nvidia", "**", "libcudart.so*"), recursive=True)
    )
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError(f"the CUDA runtime library (libcudart.so.{major}) was not found")


@functools.cache
def _runtime() -> _Runtime:
    lib = open_cudart()
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    version = ctypes.c_int()
    _check(lib, lib.cudaRuntimeGetVersion(ctypes.byref(version)), "cudaRuntimeGetVersion")
    lib.cudaMemcpyAsync.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    runtime = _Runtime(lib, version.value)
    if runtime.has_batch:
        extra = [] if runtime.version >= _NO_FAIL_INDEX_VERSION else [ctypes.c_void_p]
        lib.cudaMemcpyBatchAsync.argtypes = [ctypes.c_void_p] * 3 + [
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            *extra,
            ctypes.c_void_p,
        ]
    return runtime


def clear_caches() -> None:
    """Test-facing: forget whether the runtime loaded, so the next :func:`available` looks again
    (after a test changed ``torch.version`` or :func:`open_cudart`)."""
    available.cache_clear()
    _runtime.cache_clear()


def runtime_load_attempts() -> int:
    """Test-facing: how many times the runtime library was looked for since the last
    :func:`clear_caches` (a load that failed is looked for again next time)."""
    return _runtime.cache_info().misses


@functools.cache
def available() -> bool:
    """Whether engine copies can be issued: a CUDA (not ROCm) build whose runtime library loads
    (the direct ops fall back to one ``copy_`` per run otherwise)."""
    if torch.version.hip or not torch.version.cuda:
        return False
    try:
        _runtime()
    except (OSError, RuntimeError, AttributeError):  # AttributeError: a symbol is missing
        return False
    return True


def _check(lib: ctypes.CDLL, err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what} failed: {lib.cudaGetErrorString(err).decode()} ({err})")


def copy_batch(dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray, device: torch.device) -> None:
    """Queue ``nbytes[j]`` bytes from address ``src[j]`` to ``dst[j]`` for every ``j``.

    Asynchronous, in order on ``device``'s current stream; copies within one call do not overlap
    in their destinations (the direct ops guarantee it). Host memory must be pinned for the copy
    to be asynchronous and to run on the copy engines.

    Parameters
    ----------
    dst, src, nbytes : 1-D arrays of equal length, converted to uint64 (addresses, sizes).
    device : the CUDA device whose current stream orders the copies.
    """
    runtime = _runtime()
    dst, src, nbytes = (np.ascontiguousarray(a, dtype=np.uint64) for a in (dst, src, nbytes))
    if not len(dst):
        return
    with torch.cuda.device(device):  # the runtime issues on the calling thread's device
        stream = torch.cuda.current_stream(device).cuda_stream
        if runtime.has_batch and stream:
            _batch(runtime, dst, src, nbytes, stream)
            return
        for d, s, n in zip(dst.tolist(), src.tolist(), nbytes.tolist(), strict=True):
            _check(
                runtime.lib,
                runtime.lib.cudaMemcpyAsync(d, s, n, _MEMCPY_DEFAULT, stream),
                "cudaMemcpyAsync",
            )


def _batch(
    runtime: _Runtime, dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray, stream: int
) -> None:
    attrs = _Attributes(src_access_order=_SRC_ACCESS_ORDER_STREAM)
    first = np.zeros(1, dtype=np.uint64)  # every copy uses attrs[0]
    fail = [] if runtime.version >= _NO_FAIL_INDEX_VERSION else [ctypes.byref(ctypes.c_size_t())]
    err = runtime.lib.cudaMemcpyBatchAsync(
        dst.ctypes.data,
        src.ctypes.data,
        nbytes.ctypes.data,
        len(dst),
        ctypes.byref(attrs),
        first.ctypes.data,
        1,
        *fail,
        stream,
    )
    _check(runtime.lib, err, "cudaMemcpyBatchAsync")

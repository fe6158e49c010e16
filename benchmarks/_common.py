"""Shared benchmark helpers: importing hicache from a checkout, memory arenas, timing, tables.

Timing on CUDA uses events around a batch of calls, preceded by a ``torch.cuda._sleep`` gate long
enough for the CPU to enqueue the whole batch, so a sample measures GPU time rather than Python
launch overhead. On CPU it is wall-clock time. Every sample rotates through inputs by passing the
call number ``k`` to the measured function.
"""

from __future__ import annotations

import importlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
KIB = 1024
MIB = 1024 * KIB
GB = 1e9  # bandwidths are reported in GB/s (10^9 bytes per second)
SUSTAINED_S = 0.02  # the back-to-back run behind ``Timing.sustained_s`` lasts about this long


def import_hicache(module: str) -> ModuleType:
    """Import ``hicache.<module>`` from this checkout (the package need not be installed)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module(f"hicache.{module}")


def pick_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


ARENA_PINNING = ("plain", "touch", "huge")


def host_arena(nbytes: int, device: torch.device, pinning: str = "touch") -> torch.Tensor:
    """A uint8 host buffer of ``nbytes``, page-locked (cudaHostRegister) when ``device`` is CUDA.

    Registering an ordinary tensor avoids ``pin_memory=True``'s rounding up to a power of two.
    ``pinning``: ``plain``, one ``cudaHostRegister`` of fresh memory (the driver faults it in on
    one thread); ``touch``, pages faulted in on several threads first (``host_memory.pin_buffer``
    in one registration, as host pools do); ``huge``, the same after huge-page advice.
    """
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if device.type == "cuda":
        if pinning == "plain":
            import_hicache("devices").pin_tensor(buf)
        else:
            mem = import_hicache("pools.host_memory")
            mem.pin_buffer(buf, max(nbytes, 1), huge_pages=pinning == "huge")
    return buf


def device_arena(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer of ``nbytes`` on ``device``."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def parse_sizes(text: str) -> list[int]:
    """``"512,1K,2k,16K,1M"`` -> ``[512, 1024, 2048, 16384, 1048576]``."""
    units = {"k": KIB, "m": MIB}
    out = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        scale = units.get(part[-1], 1)
        out.append(int(part[:-1] if scale > 1 else part) * scale)
    return out


def fmt_size(n: int) -> str:
    """``2048 -> "2K"``, ``65536 -> "64K"``, ``512 -> "512"``."""
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M"
    return f"{n // KIB}K" if n >= KIB and n % KIB == 0 else str(n)


@dataclass(frozen=True)
class Timing:
    """Per-call seconds: median over samples; ``cpu_s`` is the CPU time of one early call (an
    upper bound, used to size gates); ``sustained_s`` the wall time per call of calls issued
    back to back with no gate (the longer of issuing and running one: what a loop sustains)."""

    median_s: float
    samples_s: tuple[float, ...]
    inner: int
    cpu_s: float
    sustained_s: float


class Clock:
    """Times callables on one device (CUDA events, or wall clock on CPU)."""

    def __init__(self, device: torch.device, *, warmup: int, samples: int, min_sample_s: float):
        self.device = device
        self.cuda = device.type == "cuda"
        self.warmup, self.samples, self.min_sample_s = warmup, samples, min_sample_s
        self._cycles_per_s = self._calibrate_sleep() if self.cuda else 0.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def gate(self, seconds: float) -> None:
        """Hold the current CUDA stream ``seconds`` (at most 50 ms) while the CPU runs ahead."""
        if self.cuda and seconds > 0:
            torch.cuda._sleep(int(min(seconds, 0.05) * self._cycles_per_s))

    def _calibrate_sleep(self) -> float:
        cycles = 20_000_000
        torch.cuda._sleep(cycles // 10)  # warm the sleep kernel
        start, end = self.event(), self.event()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    def measure(self, fn: Callable[[int], None]) -> Timing:
        """Median seconds per call of ``fn(k)``; ``k`` counts calls so inputs can rotate."""
        for k in range(self.warmup):
            fn(k)
        self.sync()
        t0 = time.perf_counter()
        fn(self.warmup)
        cpu_s = time.perf_counter() - t0
        self.sync()
        one_s = time.perf_counter() - t0
        inner = max(1, min(64, math.ceil(self.min_sample_s / max(one_s, 1e-9))))
        n = self.samples if one_s < 0.05 else max(3, self.samples // 2)  # long calls: fewer
        run = self._samples_cuda if self.cuda else self._samples_cpu
        k = self.warmup + 1
        per_call = run(fn, n, inner, cpu_s, k)
        calls = max(3, inner, min(64, math.ceil(SUSTAINED_S / max(one_s, 1e-9))))
        self.sync()
        t0 = time.perf_counter()
        for j in range(calls):
            fn(k + n * inner + j)
        self.sync()
        sustained = (time.perf_counter() - t0) / calls
        return Timing(statistics.median(per_call), tuple(per_call), inner, cpu_s, sustained)

    def _samples_cuda(
        self, fn: Callable[[int], None], n: int, inner: int, cpu_s: float, k: int
    ) -> list[float]:
        pairs = []
        for _ in range(n):
            self.gate(1.2 * inner * cpu_s + 50e-6 if cpu_s else 0.0)
            start, end = self.event(), self.event()
            start.record()
            for _ in range(inner):
                fn(k)
                k += 1
            end.record()
            pairs.append((start, end))
        self.sync()
        return [s.elapsed_time(e) / 1e3 / inner for s, e in pairs]

    def _samples_cpu(
        self, fn: Callable[[int], None], n: int, inner: int, cpu_s: float, k: int
    ) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(k)
                k += 1
            out.append((time.perf_counter() - t0) / inner)
        return out


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> str:
    """Fixed-width text table: first column left-aligned, the rest right-aligned."""
    cols = [header, *rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        tail = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        cells = [r[0].ljust(widths[0]), *tail]
        return "  ".join(cells).rstrip()

    out = [title] if title else []
    out += [line(header), "  ".join("-" * w for w in widths)]
    return "\n".join(out + [line(r) for r in rows])


def describe_device(device: torch.device) -> dict[str, object]:
    """GPU name, SM count and library versions for the JSON header."""
    info: dict[str, object] = {"device": str(device), "torch": torch.__version__}
    try:
        info["triton"] = importlib.import_module("triton").__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=props.multi_processor_count)
    return info


def log(msg: str) -> None:
    """Progress to stderr, so stdout ends with the table."""
    print(msg, file=sys.stderr, flush=True)

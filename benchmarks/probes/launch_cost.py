"""Probe: where the CPU time of one per-layer launch goes (CUDA only; us per call, medians).

Rows: the controller's per-layer step pieces, from the whole ``LoadPlan.run`` down to the C
launcher Triton's runner calls, and the event record in torch and through the CUDA runtime.

    PYTHONPATH=. python3 benchmarks/probes/launch_cost.py
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_issue  # noqa: E402
from host_hit import us_per_call as _us  # noqa: E402

triton_ops = bench_issue.triton_ops


def _cudart() -> ctypes.CDLL | None:
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def main() -> None:
    device = torch.device("cuda")
    dev, alloc, host, ctrl, h = bench_issue._setup("kernel", 64, 8192, device, (8, 128))
    d = alloc.alloc(8192)
    stream = ctrl.load_stream
    rows: list[tuple[str, float]] = []
    with torch.cuda.stream(stream):
        plan = host.plan_load(dev, h.pin_memory().to(device), d, "kernel")
        plan.run(0)
        rows.append(("LoadPlan.run(l)", _us(lambda: plan.run(5))))
        rows.append(("LayerPlan.run(l)", _us(lambda: plan.runner.run(5))))
        launcher = getattr(plan.runner, "_launcher", None)
        if launcher is not None:
            rows.append(("Launcher.run(l)", _us(lambda: launcher.run(5))))
            args = list(launcher._args)  # with layer 5's addresses, as run(5) sets them
            prepared = launcher.prepared
            for slot, address in zip(prepared.address_slots, prepared.layers[5], strict=True):
                args[slot] = address
            rows.append(("list(args) copy", _us(lambda: list(args))))
            direct = launcher._compiled  # what run(l) calls after layer 0
            rows.append(("the plan's direct launcher call", _us(lambda: direct(*args))))
            g = launcher._grid
            ck = triton_ops.transfer_kernel[g](*args, num_warps=prepared.num_warps)  # binds
            rows.append(
                (
                    "Triton bind + launch (JIT run)",
                    _us(
                        lambda: triton_ops.transfer_kernel[g](*args, num_warps=prepared.num_warps),
                        64,
                    ),
                )
            )
            runner = ck[g]
            rows.append(("Triton's compiled runner(*args)", _us(lambda: runner(*args))))
            raw = stream.cuda_stream
            rows.append(("runner(*args, stream=raw)", _us(lambda: runner(*args, stream=raw))))
        rows.append(("torch.cuda.current_device()", _us(torch.cuda.current_device)))
        rows.append(("torch.cuda.current_stream()", _us(torch.cuda.current_stream)))
        ev = torch.cuda.Event()
        ev.record(stream)
        rows.append(("Event.record(stream)", _us(lambda: ev.record(stream))))
        rows.append(("stream.record_event(ev)", _us(lambda: stream.record_event(ev))))
        rows.append(("new Event + record", _us(lambda: torch.cuda.Event().record(stream))))
        comp = torch.cuda.current_stream(device)
        rows.append(("Event.wait(other stream)", _us(lambda: ev.wait(comp))))
        lib = _cudart()
        if lib is not None:
            e, s = ctypes.c_void_p(ev.cuda_event), ctypes.c_void_p(stream.cuda_stream)
            rows.append(("cudaEventRecord via ctypes", _us(lambda: lib.cudaEventRecord(e, s))))
    for name, us in rows:
        print(f"{name:40s} {us:8.2f} us")


if __name__ == "__main__":
    main()

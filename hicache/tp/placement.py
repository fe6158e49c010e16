"""Where each TP rank runs: its device, and the backends of its process group.

A rank of a CPU group runs on the CPU over gloo. Rank ``r`` of a CUDA group runs on
``cuda:{r % device_count}``: its model shard, its device pool and its pinned host pool live on
(or are pinned for) that GPU, so N ranks on N GPUs each own one, and two ranks on a one-GPU
machine share it.

The process group carries two kinds of collective: the model's all-reduces (CUDA tensors, MBs
per layer) and the cache's agreement (``TPGroup``: one CPU word vector per agreement point).

- **Each rank its own GPU** (``size <= device_count``): ``"cpu:gloo,cuda:nccl"``, one group
  whose CUDA tensors go through NCCL and whose CPU tensors through gloo. The model's
  all-reduces run on NCCL; the agreement stays on the CPU (gloo), so it never waits for the
  compute stream and never syncs it.
- **Ranks sharing a GPU** (``size > device_count``): ``"gloo"`` for both. NCCL refuses a
  communicator with two ranks on one GPU ("Duplicate GPU detected"); gloo all-reduces CUDA
  tensors through host memory: slower, exact, and enough to test TP on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.checks import check_int

DEVICES = ("cpu", "cuda")
SHARED_GPU_BACKEND = "gloo"
OWN_GPU_BACKEND = "cpu:gloo,cuda:nccl"


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs.

    Attributes
    ----------
    rank : the rank.
    device : ``"cpu"`` or ``"cuda:<index>"``: the device of its model shard and pools.
    backend : the ``torch.distributed.init_process_group`` backend of its group.
    """

    rank: int
    device: str
    backend: str


def place_rank(device: str, rank: int, size: int, device_count: int) -> RankPlacement:
    """Rank ``rank`` of ``size`` on ``device`` (``"cpu"`` or ``"cuda"``) of a machine with
    ``device_count`` GPUs. ``ValueError`` naming the argument for a device other than those
    two (an indexed ``"cuda:1"`` included: the rank picks its GPU), a rank outside
    ``[0, size)``, or ``"cuda"`` without a GPU."""
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(
            f"device must be one of {list(DEVICES)} (rank r of a CUDA group runs on "
            f"cuda:{{r % device_count}}), got {device!r}"
        )
    check_int("size", size, minimum=1)
    check_int("rank", rank, minimum=0)
    check_int("device_count", device_count, minimum=0)
    if rank >= size:
        raise ValueError(f"rank must be < size={size}, got {rank}")
    if device == "cpu":
        return RankPlacement(rank, "cpu", "gloo")
    if device_count == 0:
        raise ValueError("device='cuda' but this machine has no CUDA device; use device='cpu'")
    shared = size > device_count
    backend = SHARED_GPU_BACKEND if shared else OWN_GPU_BACKEND
    return RankPlacement(rank, f"cuda:{rank % device_count}", backend)


def takes_cpu_tensors(backend: str) -> bool:
    """Whether a process group of ``backend`` (as ``torch.distributed.get_backend`` names it:
    ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``) runs collectives on CPU tensors."""
    parts = backend.split(",")
    if all(":" in part for part in parts):  # one backend per device type
        return any(part.split(":", 1)[0] == "cpu" for part in parts)
    return backend != "nccl"


__all__ = ["RankPlacement", "place_rank", "takes_cpu_tensors"]

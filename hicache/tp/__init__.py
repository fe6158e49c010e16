"""Tensor parallelism: the ranks of one TP group agree on every rank-local cache decision.

``TPGroup`` wraps a ``torch.distributed`` process group with bounded collectives;
``run_ranks`` starts N ranks as processes over loopback (tests, the TP fuzz in
``hicache.stress.tp_fuzz`` and ``hicache bench --tp``), on the CPU over gloo or each on its
GPU (``place_rank``: NCCL for the model where every rank has its own GPU, gloo otherwise and
for the agreement).
"""

from hicache.tp.group import TRANSPORTS, TPError, TPGroup, TPPeerError, Vote, as_tp_group
from hicache.tp.launch import RankFailed, RankOutcome, launch_ranks, placements, run_ranks
from hicache.tp.placement import RankPlacement, place_rank, takes_cpu_tensors

__all__ = [
    "TRANSPORTS",
    "RankFailed",
    "RankOutcome",
    "RankPlacement",
    "TPError",
    "TPGroup",
    "TPPeerError",
    "Vote",
    "as_tp_group",
    "launch_ranks",
    "place_rank",
    "placements",
    "run_ranks",
    "takes_cpu_tensors",
]

"""Tensor parallelism: the ranks of one TP group agree on every rank-local cache decision.

``TPGroup`` wraps a ``torch.distributed`` process group with bounded collectives;
``run_ranks`` starts N ranks as processes over loopback gloo (tests, the TP fuzz in
``hicache.stress.tp_fuzz`` and ``hicache bench --tp``).
"""

from hicache.tp.group import TPError, TPGroup, TPPeerError, as_tp_group
from hicache.tp.launch import RankFailed, RankOutcome, launch_ranks, run_ranks

__all__ = [
    "RankFailed",
    "RankOutcome",
    "TPError",
    "TPGroup",
    "TPPeerError",
    "as_tp_group",
    "launch_ranks",
    "run_ranks",
]

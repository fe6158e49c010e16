"""``hicache bench --tp N``: the workload on N tensor-parallel ranks, each a process holding its
shard of the model and of the pools (``hicache.tp.run_ranks``): on the CPU over gloo, or with
``--device cuda`` rank r on ``cuda:{r % GPUs}`` (NCCL for the model when every rank has its
own GPU, gloo when they share; the cache agrees through shared memory either way, the ranks
being on one host: ``hicache.tp.shm``).

Every rank runs the same runs (modes, or storage phases) through its own engine; the caches
agree over the group. The ranks' trees are identical by construction, so every rank must see
the same hits: rank 0's results are the report only once every rank's hit rates (per tier, per
round) and token counts equal rank 0's; otherwise ``TPMismatch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hicache.bench.config import BenchConfig
from hicache.devices import canonical_device
from hicache.tp import run_ranks

TIMEOUT_S = 1800.0  # a rank still running then is killed (the whole run fails)
GROUP_TIMEOUT_S = 60.0  # a collective (a model all-reduce) stuck this long fails its rank
SUMMARY_KEYS = (
    "requests",
    "rejected",
    "device_hit_rate",
    "host_hit_rate",
    "storage_hit_rate",
    "hit_rate",
    "reused_tokens",
    "computed_tokens",
)
ROUND_KEYS = ("device_hit_rate", "host_hit_rate", "storage_hit_rate", "hit_rate")

RunsFn = Callable[..., dict[str, Any]]


class TPMismatch(RuntimeError):
    """The ranks of one ``--tp`` run saw different hits: their caches diverged."""


def run_tp(
    runs: RunsFn, cfg: BenchConfig, progress: bool, names: list[str], *args: Any
) -> dict[str, Any]:
    """``runs(cfg, *args, progress=..., group=...)`` on ``cfg.tp`` ranks (progress on rank 0
    only), each returning ``{name: run}`` for ``names``; rank 0's results, once
    ``check_same_hits`` passed. ``hicache.tp.RankFailed`` when a rank failed, ``TPMismatch``
    when the ranks' hits differ."""
    results = run_ranks(
        _rank,
        cfg.tp,
        runs,
        cfg,
        progress,
        args,
        timeout_s=TIMEOUT_S,
        device=cfg.device,
        group_timeout_s=GROUP_TIMEOUT_S,
    )
    check_same_hits(results, names)
    return {**results[0], "tp_ranks": [r["tp_rank"] for r in results]}


def _rank(
    group: Any, runs: RunsFn, cfg: BenchConfig, progress: bool, args: tuple[Any, ...]
) -> dict[str, Any]:
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)  # a fresh process: nothing to restore
    first = dist.get_rank(group) == 0
    where = {"device": str(canonical_device(cfg.device)), "backend": str(dist.get_backend(group))}
    return {**runs(cfg, *args, progress=progress and first, group=group), "tp_rank": where}


def tp_line(cfg: BenchConfig, results: dict[str, Any]) -> str:
    """The report's TP line: the ranks, where they ran, and that their hits agreed."""
    ranks = results["tp_ranks"]
    devices = ", ".join(r["device"] for r in ranks)
    return (
        f"TP: {cfg.tp} ranks on {devices} ({ranks[0]['backend']}); every rank saw these hit "
        "rates (per tier, per round)\n"
    )


def check_same_hits(results: list[dict[str, Any]], names: list[str]) -> None:
    """``TPMismatch`` listing every figure of ``SUMMARY_KEYS`` (each named run's summary) and
    ``ROUND_KEYS`` (each round) on which a rank differs from rank 0."""
    bad = []
    for mode in names:
        per_rank = [figures(r[mode]) for r in results]
        for name, value in per_rank[0].items():
            values = [f[name] for f in per_rank]
            if any(v != value for v in values):
                bad.append(
                    f"{mode} {name}: " + ", ".join(f"rank {i} {v}" for i, v in enumerate(values))
                )
    if bad:
        raise TPMismatch(
            f"the {len(results)} TP ranks saw different hits (their caches diverged): "
            + "; ".join(bad)
        )


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one mode's run that every rank must share: ``SUMMARY_KEYS`` of its
    summary, ``ROUND_KEYS`` of each round."""
    out = {key: run["summary"][key] for key in SUMMARY_KEYS}
    for rnd in run["rounds"]:
        out.update({f"round {rnd['round']} {key}": rnd[key] for key in ROUND_KEYS})
    return out

"""One call recipe per transfer op, over the buffers of :mod:`_kv_buffers`.

A *load* moves one layer far -> near (host -> device), a *backup* all layers near -> far. Call
``k`` uses layer ``k % layers`` and index set ``k % n_sets``, so repeated calls rotate inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from _kv_buffers import IndexSet, Pools, Shape

Args = Callable[[Pools, int, int], tuple]  # (pools, call number, direct token count) -> op args


@dataclass(frozen=True)
class OpSpec:
    """How to call one op. ``kind``: ``load`` (far -> near, one layer) or ``backup`` (all layers).

    :meth:`tensors` counts the tensors per call (K and V, or one MLA latent; times layers for
    backups): it sets the bytes moved and, for direct ops, the ``copy_`` calls per page run.
    """

    op: str
    kind: str
    layout: str
    mla: bool
    args: Args

    @property
    def direct(self) -> bool:
        return "direct" in self.op

    @property
    def label(self) -> str:
        short = self.op.removeprefix("transfer_kv_")
        return f"{short} ({self.layout})" if short == "direct" else short

    def tensors(self, layers: int) -> int:
        return (1 if self.mla else 2) * (layers if self.kind == "backup" else 1)

    def bytes_moved(self, shape: Shape, tokens: int) -> int:
        return self.tensors(shape.layers) * tokens * shape.item


def _sl(p: Pools, k: int, n: int) -> tuple[int, IndexSet, slice]:
    layer, ix = p.at(k)
    return layer, ix, slice(0, n)


def _load_lf(p: Pools, k: int, n: int) -> tuple:
    ly, ix, _ = _sl(p, k, n)
    f = p.far
    return (f["k_lf"][ly], p.near_k[ly], f["v_lf"][ly], p.near_v[ly], ix.far, ix.near, p.item)


def _load_paged(p: Pools, k: int, layout: str) -> tuple:
    ly, ix = p.at(k)
    f = p.far
    return (
        f["k_" + layout],
        p.near_k[ly],
        f["v_" + layout],
        p.near_v[ly],
        ix.far,
        ix.near,
        ly,
        p.item,
        p.layout_dim,
    )


def _load_pf(p: Pools, k: int, n: int) -> tuple:
    return _load_paged(p, k, "pf")


def _load_ph(p: Pools, k: int, n: int) -> tuple:
    return (*_load_paged(p, k, "ph"), p.shape.page_size, p.shape.head_num)


def _load_mla(p: Pools, k: int, n: int) -> tuple:
    ly, ix, _ = _sl(p, k, n)
    return (p.far["kv_lf"][ly], p.near_kv[ly], ix.far, ix.near, p.item)


def _load_mla_pf(p: Pools, k: int, n: int) -> tuple:
    ly, ix, _ = _sl(p, k, n)
    return (p.far["kv_pf"], p.near_kv[ly], ix.far, ix.near, ly, p.item, p.layout_dim)


def _load_direct(p: Pools, k: int, n: int) -> tuple:
    ly, ix, s = _sl(p, k, n)
    src = [p.far["k_lf"][ly], p.far["v_lf"][ly]]
    return (src, [p.near_k[ly], p.near_v[ly]], ix.far_cpu[s], ix.near_cpu[s], p.shape.page_size)


def _load_direct_pf(p: Pools, k: int, n: int) -> tuple:
    ly, ix, s = _sl(p, k, n)
    src = [p.far["k_pfd"], p.far["v_pfd"]]
    return (src, [p.near_k[ly], p.near_v[ly]], ix.far_cpu[s], ix.near_cpu[s], ly, p.shape.page_size)


def _backup_lf(p: Pools, k: int, n: int) -> tuple:
    _, ix, _ = _sl(p, k, n)
    q = p.ptrs
    return (
        q["near_k"],
        q["far_k"],
        q["near_v"],
        q["far_v"],
        ix.near,
        ix.far,
        p.item,
        p.shape.layers,
    )


def _backup_pf(p: Pools, k: int, n: int) -> tuple:
    _, ix, _ = _sl(p, k, n)
    q, f = p.ptrs, p.far
    return (
        q["near_k"],
        f["k_pf"],
        q["near_v"],
        f["v_pf"],
        ix.near,
        ix.far,
        p.item,
        p.layout_dim,
        p.shape.layers,
    )


def _backup_ph(p: Pools, k: int, n: int) -> tuple:
    _, ix, _ = _sl(p, k, n)
    q, f, s = p.ptrs, p.far, p.shape
    return (
        q["near_k"],
        f["k_ph"],
        q["near_v"],
        f["v_ph"],
        ix.near,
        ix.far,
        p.item,
        p.layout_dim,
        s.layers,
        s.page_size,
        s.head_num,
    )


def _backup_mla(p: Pools, k: int, n: int) -> tuple:
    _, ix, _ = _sl(p, k, n)
    q = p.ptrs
    return (q["near_kv"], q["far_kv"], ix.near, ix.far, p.item, p.shape.layers)


def _backup_mla_pf(p: Pools, k: int, n: int) -> tuple:
    _, ix, _ = _sl(p, k, n)
    return (
        p.ptrs["near_kv"],
        p.far["kv_pf"],
        ix.near,
        ix.far,
        p.item,
        p.layout_dim,
        p.shape.layers,
    )


def _backup_direct(p: Pools, k: int, n: int) -> tuple:
    _, ix, s = _sl(p, k, n)
    dst = list(p.far["k_lf"]) + list(p.far["v_lf"])
    return (p.near_k + p.near_v, dst, ix.near_cpu[s], ix.far_cpu[s], p.shape.page_size)


def _backup_direct_pf(p: Pools, k: int, n: int) -> tuple:
    _, ix, s = _sl(p, k, n)
    dst = [p.far["k_pfd"], p.far["v_pfd"]]
    return (p.near_k + p.near_v, dst, ix.near_cpu[s], ix.far_cpu[s], p.shape.page_size)


def _spec(op: str, kind: str, layout: str, args: Args) -> OpSpec:
    return OpSpec("transfer_kv_" + op, kind, layout, "mla" in op, args)


SPECS: tuple[OpSpec, ...] = (
    _spec("per_layer", "load", "layer_first", _load_lf),
    _spec("per_layer_pf_lf", "load", "page_first", _load_pf),
    _spec("per_layer_ph_lf", "load", "page_head", _load_ph),
    _spec("per_layer_mla", "load", "layer_first", _load_mla),
    _spec("per_layer_mla_pf_lf", "load", "page_first", _load_mla_pf),
    _spec("direct", "load", "layer_first", _load_direct),
    _spec("per_layer_direct_pf_lf", "load", "page_first_direct", _load_direct_pf),
    _spec("all_layer", "backup", "layer_first", _backup_lf),
    _spec("all_layer_lf_pf", "backup", "page_first", _backup_pf),
    _spec("all_layer_lf_ph", "backup", "page_head", _backup_ph),
    _spec("all_layer_mla", "backup", "layer_first", _backup_mla),
    _spec("all_layer_mla_lf_pf", "backup", "page_first", _backup_mla_pf),
    _spec("direct", "backup", "layer_first", _backup_direct),
    _spec("all_layer_direct_lf_pf", "backup", "page_first_direct", _backup_direct_pf),
)


def spec(op: str, kind: str) -> OpSpec:
    """The spec of ``transfer_kv_<op>`` used as a ``kind`` transfer."""
    return next(s for s in SPECS if s.op == "transfer_kv_" + op and s.kind == kind)


def direct_tokens(sp: OpSpec, shape: Shape, max_copies: int) -> int:
    """Tokens a direct op moves so one call issues at most ``max_copies`` copies (page runs
    times tensors; scattered pages never merge). Kernel ops move all ``shape.tokens``."""
    if not sp.direct:
        return shape.tokens
    pages = max(1, max_copies // sp.tensors(shape.layers))
    return min(shape.tokens, pages * shape.page_size)


def bind(
    kernels: ModuleType, sp: OpSpec, pools: Pools, tokens: int, knobs: dict
) -> Callable[[int], None]:
    """``fn(k)`` running call ``k`` of ``sp`` (kernel ops get ``knobs``: block_quota, warps)."""
    fn = getattr(kernels, sp.op)
    kw = {} if sp.direct else knobs
    return lambda k: fn(*sp.args(pools, k, tokens), **kw)

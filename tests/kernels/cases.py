"""Test cases for the ten kernel ops: random buffers in every layout, a slow oracle, placement.

The oracle indexes the tensors by their documented shapes (layer_first ``[items, H, D]``,
page_first ``[items, L, H, D]``, page_head ``[pages, H, page_size, L, D]``), one item at a time,
so it shares no code with the byte geometry of :mod:`hicache.kernels.layouts`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

import hicache.kernels as K

POISON = 0xA5
Buffer = torch.Tensor | list[torch.Tensor]  # one tensor, or one per layer ("tables")


@dataclass(frozen=True)
class OpSpec:
    """One op: the layout of its source and destination, MHA (K and V) or MLA (one latent)."""

    name: str
    src: str  # "lf" (one layer), "tables" (a pointer table of layers), "pf", "ph"
    dst: str
    mla: bool = False

    @property
    def op(self):
        return getattr(K, self.name)

    @property
    def kvs(self) -> list[str]:
        return [""] if self.mla else ["k", "v"]

    def arg_name(self, side: str, kv: str) -> str:
        layout = self.src if side == "src" else self.dst
        return side + (f"_{kv}" if kv else "") + ("_layers" if layout == "tables" else "")

    def __str__(self) -> str:
        return self.name


SPECS = [
    OpSpec("transfer_kv_per_layer", "lf", "lf"),
    OpSpec("transfer_kv_per_layer_pf_lf", "pf", "lf"),
    OpSpec("transfer_kv_per_layer_ph_lf", "ph", "lf"),
    OpSpec("transfer_kv_all_layer", "tables", "tables"),
    OpSpec("transfer_kv_all_layer_lf_pf", "tables", "pf"),
    OpSpec("transfer_kv_all_layer_lf_ph", "tables", "ph"),
    OpSpec("transfer_kv_per_layer_mla", "lf", "lf", mla=True),
    OpSpec("transfer_kv_per_layer_mla_pf_lf", "pf", "lf", mla=True),
    OpSpec("transfer_kv_all_layer_mla", "tables", "tables", mla=True),
    OpSpec("transfer_kv_all_layer_mla_lf_pf", "tables", "pf", mla=True),
]
PH_SPECS = [s for s in SPECS if "ph" in (s.src, s.dst)]


@dataclass(frozen=True)
class Config:
    dtype: torch.dtype = torch.float16
    layers: int = 3
    heads: int = 2  # MLA uses 1
    head_dim: int = 8  # MLA: kv_dim
    page_size: int = 1
    src_items: int = 64
    dst_items: int = 48
    n: int = 24
    layer_id: int = -1  # per-layer ops; -1 means the last layer
    pattern: str = "random"  # or "runs": whole pages in order

    def shape(self, layout: str, items: int, heads: int) -> tuple[int, ...]:
        h, d, L, ps = heads, self.head_dim, self.layers, self.page_size
        return {
            "lf": (items, h, d),
            "tables": (items, h, d),
            "pf": (items, L, h, d),
            "ph": (items // ps, h, ps, L, d),
        }[layout]


def random_bytes(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Fresh non-zero random bytes viewed as ``dtype`` (NaN patterns included: compare bytes)."""
    elem = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(1, 256, (*shape[:-1], shape[-1] * elem), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    elem = torch.empty(0, dtype=dtype).element_size()
    return torch.full((*shape[:-1], shape[-1] * elem), POISON, dtype=torch.uint8).view(dtype)


def _make(layout: str, cfg: Config, items: int, heads: int, fill) -> Buffer:
    if layout == "tables":
        return [fill(cfg.shape(layout, items, heads), cfg.dtype) for _ in range(cfg.layers)]
    return fill(cfg.shape(layout, items, heads), cfg.dtype)


def indices(items: int, n: int, page: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """``n`` distinct item indices below ``items``: random, or whole pages in order."""
    if pattern == "random":
        return torch.randperm(items, generator=gen)[:n]
    pages = torch.randperm(items // page, generator=gen)[: n // page].sort().values
    return (pages[:, None] * page + torch.arange(page)).flatten()


def item_view(layout: str, buf: Buffer, i: int, layer: int, page: int) -> torch.Tensor:
    """``[H, D]`` view of item ``i`` of ``layer`` by the documented shapes."""
    if layout == "tables":
        return buf[layer][i]
    if layout == "lf":
        return buf[i]
    if layout == "pf":
        return buf[i, layer]
    return buf[i // page, :, i % page, layer]


def as_bytes(buf: Buffer) -> list[torch.Tensor]:
    tensors = buf if isinstance(buf, list) else [buf]
    return [t.detach().cpu().contiguous().view(torch.uint8) for t in tensors]


@dataclass
class Case:
    """Buffers, indices and the expected destination of one call, all on the CPU."""

    spec: OpSpec
    cfg: Config
    src: list[Buffer] = field(default_factory=list)
    dst: list[Buffer] = field(default_factory=list)
    src_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    dst_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0))

    @property
    def heads(self) -> int:
        return 1 if self.spec.mla else self.cfg.heads

    @property
    def item_size(self) -> int:
        return self.heads * self.cfg.head_dim * torch.empty(0, dtype=self.cfg.dtype).element_size()

    @property
    def layer_id(self) -> int:
        return self.cfg.layer_id % self.cfg.layers

    @property
    def per_layer(self) -> bool:
        return self.spec.dst == "lf"

    def layer_pairs(self) -> list[int]:
        return [self.layer_id] if self.per_layer else list(range(self.cfg.layers))

    def expected(self) -> list[list[torch.Tensor]]:
        """The destination after the copy, by the slow per-item oracle, as bytes."""
        out = [[t.clone() for t in (b if isinstance(b, list) else [b])] for b in self.dst]
        pairs = list(zip(self.src_indices.tolist(), self.dst_indices.tolist(), strict=True))
        for buf, target in zip(self.src, out, strict=True):
            target_buf: Buffer = target if self.spec.dst == "tables" else target[0]
            for layer in self.layer_pairs():
                for s, d in pairs:
                    item_view(self.spec.dst, target_buf, d, layer, self.cfg.page_size).copy_(
                        item_view(self.spec.src, buf, s, layer, self.cfg.page_size)
                    )
        return [[t.view(torch.uint8) for t in ts] for ts in out]

    def extras(self) -> dict[str, int]:
        layout_dim = self.item_size * self.cfg.layers
        values = {
            "item_size": self.item_size,
            "layer_id": self.layer_id,
            "src_layout_dim": layout_dim,
            "dst_layout_dim": layout_dim,
            "num_layers": self.cfg.layers,
            "page_size": self.cfg.page_size,
            "head_num": self.heads,
        }
        params = inspect.signature(self.spec.op).parameters
        return {k: v for k, v in values.items() if k in params}


def build(spec: OpSpec, cfg: Config, seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    case = Case(spec, cfg)
    heads = case.heads
    for _ in spec.kvs:
        case.src.append(
            _make(spec.src, cfg, cfg.src_items, heads, lambda s, d: random_bytes(s, d, gen))
        )
        case.dst.append(_make(spec.dst, cfg, cfg.dst_items, heads, poisoned))
    page = cfg.page_size if cfg.pattern == "runs" else 1
    case.src_indices = indices(cfg.src_items, cfg.n, page, cfg.pattern, gen)
    case.dst_indices = indices(cfg.dst_items, cfg.n, page, cfg.pattern, gen)
    return case


def _place(buf: Buffer, device: str) -> Buffer:
    """``device``: "cpu", "pinned" (page-locked host) or "cuda"."""
    if isinstance(buf, list):
        return [_place(t, device) for t in buf]  # type: ignore[misc]
    if device == "pinned":
        return buf.clone().pin_memory()
    return buf.clone().to(device)


def table(tensors: list[torch.Tensor], device: torch.device | str) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64, device=device)


@dataclass
class Call:
    """Keyword arguments of one call and the placed buffers they point at.

    Pointer tables do not keep their tensors alive: keep the ``Call`` until the op returns.
    """

    kwargs: dict[str, object]
    src: list[Buffer]
    dst: list[Buffer]


def prepare(
    case: Case, src_device: str = "cpu", dst_device: str = "cpu", index_device: str = "cpu"
) -> Call:
    """Place the buffers ("cpu", "pinned" or "cuda") and build the op's keyword arguments."""
    src = [_place(b, src_device) for b in case.src]
    dst = [_place(b, dst_device) for b in case.dst]
    table_device = "cuda" if "cuda" in (src_device, dst_device) else "cpu"
    kwargs: dict[str, object] = {}
    for side, bufs in (("src", src), ("dst", dst)):
        for kv, buf in zip(case.spec.kvs, bufs, strict=True):
            value = table(buf, table_device) if isinstance(buf, list) else buf
            kwargs[case.spec.arg_name(side, kv)] = value
    kwargs["src_indices"] = case.src_indices.to(index_device)
    kwargs["dst_indices"] = case.dst_indices.to(index_device)
    return Call({**kwargs, **case.extras()}, src, dst)


def run(
    case: Case,
    src_device: str = "cpu",
    dst_device: str = "cpu",
    index_device: str = "cpu",
    **launch,
) -> list[list[torch.Tensor]]:
    """Place the buffers, call the op by keyword, return the destination as CPU bytes."""
    call = prepare(case, src_device, dst_device, index_device)
    case.spec.op(**call.kwargs, **launch)
    if "cuda" in (src_device, dst_device):
        torch.cuda.synchronize()
    return [as_bytes(b) for b in call.dst]


def assert_bytes_equal(actual: list[list[torch.Tensor]], expected: list[list[torch.Tensor]]):
    for got_bufs, want_bufs in zip(actual, expected, strict=True):
        for got, want in zip(got_bufs, want_bufs, strict=True):
            assert got.shape == want.shape
            diff = (got != want).nonzero()
            assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[0].tolist()}"

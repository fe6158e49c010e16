"""Issue 12, pointer-table transfer ops: no index reaches memory outside the buffers described.

Every buffer lives inside a poisoned arena with guard rows around it (pointer-table layers one
after another, guards between), so a write one past a layer, into the next layer or before the
first would show. A rejected call must leave every arena byte as it was; an accepted one may
change only the rows its indices name. Both backends: the torch reference, and Triton under
``TRITON_INTERPRET=1`` (tiny grids).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch

import hicache.kernels as K
from hicache import env
from hicache.kernels import plans, triton_ops
from hicache.kernels.dispatch import force_backend
from tests.kernels.cases import SPECS, Config, OpSpec, poisoned, random_bytes, table

GUARD = 2  # poisoned rows before, between and after the buffers
BACKENDS = [
    "reference",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            torch.cuda.is_available() or not env.ENV.triton_interpret,
            reason="the Triton interpreter runs on CPU-only machines (TRITON_INTERPRET=1)",
        ),
    ),
]
CFG = Config(layers=2, heads=2, head_dim=4, page_size=2, src_items=8, dst_items=6, n=4)
TABLE_SPECS = [s for s in SPECS if "tables" in (s.src, s.dst)]


@dataclass
class Arena:
    """One K, V or latent buffer (a tensor, or a list of layers) inside a poisoned arena."""

    whole: torch.Tensor
    buffer: torch.Tensor | list[torch.Tensor]

    @classmethod
    def around(cls, parts: list[torch.Tensor], is_table: bool) -> Arena:
        rows, rest = parts[0].shape[0], parts[0].shape[1:]
        whole = poisoned((GUARD + len(parts) * (rows + GUARD), *rest), parts[0].dtype)
        views = []
        for j, part in enumerate(parts):
            start = GUARD + j * (rows + GUARD)
            views.append(whole[start : start + rows])
            views[-1].copy_(part)
        return cls(whole, views if is_table else views[0])


def _fill(layout: str, items: int, heads: int, make) -> list[torch.Tensor]:
    count = CFG.layers if layout == "tables" else 1
    return [make(CFG.shape(layout, items, heads), CFG.dtype) for _ in range(count)]


@dataclass
class Setup:
    """A valid call of ``spec`` over arenas; ``kwargs`` by parameter name."""

    spec: OpSpec
    src: list[Arena]
    dst: list[Arena]
    kwargs: dict[str, object]

    def snapshot(self) -> list[torch.Tensor]:
        return [a.whole.view(torch.uint8).clone() for a in self.src + self.dst]

    def call(self, **overrides: object) -> None:
        self.spec.op(**{**self.kwargs, **overrides})


def setup(spec: OpSpec, with_sizes: bool = True) -> Setup:
    gen = torch.Generator().manual_seed(5)
    heads = 1 if spec.mla else CFG.heads
    src = [
        Arena.around(
            _fill(spec.src, CFG.src_items, heads, lambda s, d: random_bytes(s, d, gen)),
            spec.src == "tables",
        )
        for _ in spec.kvs
    ]
    dst = [
        Arena.around(_fill(spec.dst, CFG.dst_items, heads, poisoned), spec.dst == "tables")
        for _ in spec.kvs
    ]
    kwargs: dict[str, object] = {}
    for side, arenas in (("src", src), ("dst", dst)):
        for kv, arena in zip(spec.kvs, arenas, strict=True):
            buf = arena.buffer
            kwargs[spec.arg_name(side, kv)] = table(buf, "cpu") if isinstance(buf, list) else buf
    item_size = heads * CFG.head_dim * CFG.dtype.itemsize
    extras = {
        "item_size": item_size,
        "layer_id": CFG.layers - 1,
        "num_layers": CFG.layers,
        "src_layout_dim": item_size * CFG.layers,
        "dst_layout_dim": item_size * CFG.layers,
        "page_size": CFG.page_size,
        "head_num": heads,
    }
    if with_sizes:
        extras |= {"src_items_per_layer": CFG.src_items, "dst_items_per_layer": CFG.dst_items}
    params = inspect.signature(spec.op).parameters
    kwargs |= {k: v for k, v in extras.items() if k in params}
    kwargs["src_indices"] = torch.tensor([0, 3, 5, 7])
    kwargs["dst_indices"] = torch.tensor([1, 0, 4, 5])
    return Setup(spec, src, dst, kwargs)


def assert_unchanged(before: list[torch.Tensor], s: Setup) -> None:
    for old, new in zip(before, s.snapshot(), strict=True):
        diff = (old != new).nonzero()
        assert diff.numel() == 0, f"{diff.shape[0]} arena bytes changed, first at {diff[0]}"


LIMITS = {"src_indices": CFG.src_items, "dst_indices": CFG.dst_items}


BAD = ["minus_one", "at_limit", "far"]


def bad_value(kind: str, limit: int) -> int:
    return {"minus_one": -1, "at_limit": limit, "far": 2**40}[kind]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("side", ["src_indices", "dst_indices"])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_out_of_range_index_raises_before_any_write(spec, side, kind, backend):
    s = setup(spec)
    bad = s.kwargs[side].clone()
    bad[1] = bad_value(kind, LIMITS[side])
    before = s.snapshot()
    with force_backend(backend), pytest.raises(IndexError, match=side):
        s.call(**{side: bad})
    assert_unchanged(before, s)
    with force_backend(backend):
        s.call()  # a normal call afterwards works


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["src_indices", "dst_indices"])
@pytest.mark.parametrize("spec", TABLE_SPECS, ids=str)
def test_negative_index_raises_index_error_without_sizes(spec, side, backend):
    """Sizes not given: a negative index is still an IndexError (it was an AssertionError)."""
    s = setup(spec, with_sizes=False)
    bad = s.kwargs[side].clone()
    bad[2] = -3
    before = s.snapshot()
    with force_backend(backend), pytest.raises(IndexError, match=side):
        s.call(**{side: bad})
    assert_unchanged(before, s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", TABLE_SPECS, ids=str)
def test_last_row_of_each_layer_copies_and_guards_stay_poisoned(spec, backend):
    """The largest legal index on every side: the rows named change, nothing around them."""
    s = setup(spec)
    s.kwargs["src_indices"] = torch.tensor([CFG.src_items - 1, 0])
    s.kwargs["dst_indices"] = torch.tensor([CFG.dst_items - 1, 0])
    with force_backend(backend):
        s.call()
    for arena in s.dst:
        layers = arena.buffer if isinstance(arena.buffer, list) else [arena.buffer]
        outside = torch.ones(arena.whole.shape[0], dtype=torch.bool)
        for layer in layers:
            start = (layer.data_ptr() - arena.whole.data_ptr()) // layer[0].nbytes
            outside[start : start + layer.shape[0]] = False
        assert bool((arena.whole[outside].view(torch.uint8) == 0xA5).all()), "a guard row changed"


@pytest.mark.parametrize(
    "value, exc", [(0, ValueError), (True, TypeError), (8.0, TypeError), (-4, ValueError)]
)
@pytest.mark.parametrize("spec", TABLE_SPECS, ids=str)
def test_bad_items_per_layer_is_rejected(spec, value, exc):
    s = setup(spec)
    before = s.snapshot()
    with pytest.raises(exc, match="src_items_per_layer"):
        s.call(src_items_per_layer=value)
    assert_unchanged(before, s)


def test_kernel_masks_table_rows_past_items_per_layer():
    """Indices that escaped validation (unchecked CUDA tensors) stop at the given size."""
    if torch.cuda.is_available() or not env.ENV.triton_interpret:
        pytest.skip("the Triton interpreter runs on CPU-only machines (TRITON_INTERPRET=1)")
    s = setup(next(spec for spec in SPECS if spec.name == "transfer_kv_all_layer_mla"))
    kw = s.kwargs
    plan = plans.all_layer(
        {"src_layers": kw["src_layers"]},
        {"dst_layers": kw["dst_layers"]},
        kw["src_indices"],
        kw["dst_indices"],
        kw["item_size"],
        CFG.layers,
        CFG.src_items,
        CFG.dst_items,
    )
    bad = dataclasses.replace(
        plan,
        src_indices=torch.tensor([1, CFG.src_items, 2]),
        dst_indices=torch.tensor([CFG.dst_items, 0, 1]),
    )
    triton_ops.launch(bad, block_quota=1, num_warps=1)
    (arena,) = s.dst
    for layer, src_layer in zip(arena.buffer, s.src[0].buffer, strict=True):
        assert torch.equal(layer[1].view(torch.uint8), src_layer[2].view(torch.uint8))
    changed = (arena.whole.view(torch.uint8) != 0xA5).any(dim=-1).any(dim=-1)
    assert int(changed.sum()) == CFG.layers, "only row 1 of each layer may change"


# -- the direct ops ----------------------------------------------------------------------------

PAGE, LAYERS, SLOTS_SRC, SLOTS_DST = 2, 2, 8, 6


def _direct_setup(name: str) -> tuple[list[Arena], list[Arena], dict[str, object]]:
    gen = torch.Generator().manual_seed(9)
    lf_src = [
        Arena.around([random_bytes((SLOTS_SRC, 2, 4), CFG.dtype, gen)], False)
        for _ in range(2 * LAYERS)
    ]
    pf_src = [
        Arena.around([random_bytes((SLOTS_SRC // PAGE, LAYERS, PAGE, 2, 4), CFG.dtype, gen)], False)
        for _ in range(2)
    ]
    lf_dst = [
        Arena.around([poisoned((SLOTS_DST, 2, 4), CFG.dtype)], False) for _ in range(2 * LAYERS)
    ]
    pf_dst = [
        Arena.around([poisoned((SLOTS_DST // PAGE, LAYERS, PAGE, 2, 4), CFG.dtype)], False)
        for _ in range(2)
    ]
    src, dst, keys = {
        "transfer_kv_direct": (lf_src, lf_dst, ("src_layers", "dst_layers")),
        "transfer_kv_per_layer_direct_pf_lf": (pf_src, lf_dst[:2], ("src_ptrs", "dst_ptrs")),
        "transfer_kv_all_layer_direct_lf_pf": (lf_src, pf_dst, ("src_ptrs", "dst_ptrs")),
    }[name]
    kwargs: dict[str, object] = {
        keys[0]: [a.buffer for a in src],
        keys[1]: [a.buffer for a in dst],
        "src_indices": torch.tensor([2, 3, 6, 7]),
        "dst_indices": torch.tensor([0, 1, 4, 5]),
        "page_size": PAGE,
    }
    if name == "transfer_kv_per_layer_direct_pf_lf":
        kwargs["layer_id"] = LAYERS - 1
    return src, dst, kwargs


DIRECT = [
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
]


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("side", ["src_indices", "dst_indices"])
@pytest.mark.parametrize("name", DIRECT)
def test_direct_op_out_of_range_index_raises_before_any_write(name, side, kind):
    src, dst, kwargs = _direct_setup(name)
    bad = kwargs[side].clone()
    bad[1] = bad_value(kind, {"src_indices": SLOTS_SRC, "dst_indices": SLOTS_DST}[side])
    before = [a.whole.view(torch.uint8).clone() for a in src + dst]
    with pytest.raises(IndexError, match=side):
        getattr(K, name)(**{**kwargs, side: bad})
    after = [a.whole.view(torch.uint8) for a in src + dst]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    getattr(K, name)(**kwargs)


def test_direct_op_rejects_zero_dim_tensors():
    """0-d tensors on both sides: ValueError naming one (was a bare IndexError)."""
    _, _, kwargs = _direct_setup("transfer_kv_direct")
    zero = torch.zeros((), dtype=CFG.dtype)
    src, dst = list(kwargs["src_layers"]), list(kwargs["dst_layers"])
    src[0], dst[0] = zero, zero.clone()
    with pytest.raises(ValueError, match=r"src_layers\[0\]"):
        K.transfer_kv_direct(**{**kwargs, "src_layers": src, "dst_layers": dst})


@pytest.mark.parametrize("name", ["transfer_kv_per_layer", "transfer_kv_direct"])
@pytest.mark.parametrize("side", ["src", "dst"])
def test_buffers_off_cpu_and_cuda_are_rejected(name, side):
    """A ``meta`` buffer was silently "copied" into, or failed inside torch."""
    live, meta = (
        torch.zeros(8, 2, 4, dtype=CFG.dtype),
        torch.zeros(8, 2, 4, dtype=CFG.dtype, device="meta"),
    )
    src, dst = (meta, live) if side == "src" else (live, meta)
    idx = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=f"{side}.* is on meta"):
        if name == "transfer_kv_direct":
            K.transfer_kv_direct([src], [dst], idx, idx, 1)
        else:
            K.transfer_kv_per_layer(src, dst, src, dst, idx, idx, 16)

"""Launch of the transfer kernel (:mod:`hicache.kernels.transfer_kernel`) for a :class:`CopyPlan`.

- A persistent grid of ``min(block_quota, work items)`` programs. ``num_warps_per_block`` is
  Triton's ``num_warps`` (threads per program ``= num_warps * warp size``), so
  ``block_quota * num_warps_per_block`` warps is all the copy ever occupies.
- The word size, the 16-byte vector path and the ``[RH, RP, ROWS, SEG]`` tile are chosen here
  from the plan's geometry; strides travel as compile-time constants.
- Index pairs are copied in the order given. Scattered pinned reads are fastest in host-address
  order (the GPU's address translation stays local), so HiCacheController sorts each load batch
  by host index once, rather than every per-layer launch sorting again.

Kernels compile lazily per geometry and Triton caches them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.compiler import CompiledKernel

from hicache.kernels.compiled_runner import SpecKey, direct, hooked, int_class, spec_key
from hicache.kernels.layouts import CopyPlan, Operand
from hicache.kernels.transfer_kernel import transfer_kernel

Grid = tuple[int, int, int]

ACCESSES_PER_THREAD = 4  # 16-byte loads in flight per thread: 64 KiB per 32-warp program
THREADS_PER_WARP = 32
LINE_BYTES = 128  # the narrowest segment a warp reads at once, where rows allow
TABLE_LIMIT = 1 << 62  # the item bound of a pointer-table side of unknown size: unbounded
_WORD_TYPES = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}


def _addresses(side: Operand) -> tuple[int, int]:
    """(K, V) start addresses: the tables themselves, or the data at ``first_layer``."""
    last = len(side.buffers) - 1
    if side.is_table:
        return side.buffers[0].data_ptr(), side.buffers[last].data_ptr()
    return side.base(0), side.base(last)


Addresses = tuple[int, int, int, int]  # (src K, src V, dst K, dst V) of one launch


def addresses(plan: CopyPlan) -> Addresses:
    """The four buffer addresses ``plan`` launches with (tables or data at ``first_layer``)."""
    return (*_addresses(plan.src), *_addresses(plan.dst))


def _alignment(plan: CopyPlan, limit: int, layers: Sequence[Addresses]) -> int:
    """Largest power of two dividing ``limit`` (one itself), the chunk, each stride and every
    data address of ``layers`` (table entries: 8-byte aligned, validated; 16 checked in-kernel)."""
    values = [plan.chunk]
    for side in (plan.src, plan.dst):
        values += side.geometry.strides
    for first, side in ((0, plan.src), (2, plan.dst)):
        if not side.is_table:
            values += [a for layer in layers for a in layer[first : first + 2]]
    return math.gcd(limit, *values)


def _side_constexprs(prefix: str, side: Operand, word: int) -> dict[str, object]:
    g = side.geometry
    return {
        f"{prefix}_TABLE": side.is_table,
        f"{prefix}_PAGE": g.page,
        f"{prefix}_PAGE_STRIDE": g.page_stride // word,
        f"{prefix}_SLOT_STRIDE": g.slot_stride // word,
        f"{prefix}_HEAD_STRIDE": g.head_stride // word,
        f"{prefix}_LAYER_BYTES": g.layer_stride,
    }


def _tile(chunk: int, heads: int, word: int, vector: int, num_warps: int) -> dict[str, int]:
    """The ``[RH, RP, ROWS, SEG]`` tile: about ``ACCESSES_PER_THREAD`` accesses per thread.

    An item is ``heads`` slices of ``chunk`` words. ``SEG``, a power of two dividing ``chunk``
    between one cache line and one warp-wide access (``vector`` bytes a lane), is about an item
    over ``ACCESSES_PER_THREAD``; a pass covers ``RP`` of a slice's ``PARTS`` segments in ``RH``
    slices, and a thread holds ``ACCESSES_PER_THREAD // (RH * RP)`` items, at least one.
    """
    vec = vector // word  # words per access
    target = min(
        THREADS_PER_WARP * vec, max(LINE_BYTES // word, chunk * heads // ACCESSES_PER_THREAD)
    )
    seg = vec
    while seg * 2 <= target and chunk % (seg * 2) == 0:
        seg *= 2
    parts = chunk // seg
    rp = min(ACCESSES_PER_THREAD, triton.next_power_of_2(parts))
    rh = min(max(1, ACCESSES_PER_THREAD // rp), triton.next_power_of_2(heads))
    rows_per_warp = THREADS_PER_WARP // (seg // vec)
    return {
        "HEADS": heads,
        "PARTS": parts,
        "SEG": seg,
        "RH": rh,
        "RP": rp,
        "ROWS": rows_per_warp * num_warps * max(1, ACCESSES_PER_THREAD // (rh * rp)),
    }


def _indices(plan: CopyPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Both index tensors on ``plan.device``."""
    src = plan.src_indices.to(plan.device, non_blocking=True).contiguous()
    dst = plan.dst_indices.to(plan.device, non_blocking=True).contiguous()
    return src, dst


def _layer_major(plan: CopyPlan) -> bool:
    """Walk layer by layer unless a side keeps an item's layers together."""
    return plan.src.geometry.layer_stride == 0 and plan.dst.geometry.layer_stride == 0


class Prepared(NamedTuple):
    """Everything of a launch but its indices (:func:`prepare`): the kernel's arguments with
    placeholders, where the addresses and the indices go, each layer's addresses, and the
    kernels compiled for its launches so far (by :func:`compiled_runner.spec_key`)."""

    args: tuple[object, ...]
    address_slots: tuple[int, ...]
    index_slots: tuple[int, ...]  # src_idx, dst_idx, n_rows
    layers: tuple[Addresses, ...]
    reuse: bool  # every layer's addresses of one integer type
    rows: int
    block_quota: int
    num_warps: int
    device: torch.device
    kernels: dict[SpecKey, CompiledKernel]
    runners: dict[tuple[SpecKey, Grid], Callable[..., None]]  # ``direct`` of a kernel and grid


def prepare(
    plan: CopyPlan, layers: Sequence[Addresses], block_quota: int, num_warps: int
) -> Prepared:
    """The launch of ``plan`` with each of ``layers``' addresses, its indices aside: tile, word
    size, constants. It holds for any plan of the same buffers and geometry."""
    assert layers
    assert (
        plan.num_layers * max(plan.src.geometry.layer_stride, plan.dst.geometry.layer_stride)
        < 2**31
    ), "layer offset overflows"
    word = _alignment(plan, 8, layers)
    align16 = _alignment(plan, 16, layers) == 16
    tile = _tile(plan.chunk // word, plan.heads, word, 16 if align16 else word, num_warps)
    src_limit, dst_limit = (
        side.num_items if side.num_items is not None else TABLE_LIMIT
        for side in (plan.src, plan.dst)
    )
    named: dict[str, object] = dict(
        num_layers=plan.num_layers,
        src_limit=src_limit,
        dst_limit=dst_limit,
        NUM_KV=plan.num_kv,
        WORD_TY=_WORD_TYPES[word],
        ALIGN16=align16,
        LAYER_MAJOR=_layer_major(plan),
        **tile,
        **_side_constexprs("S", plan.src, word),
        **_side_constexprs("D", plan.dst, word),
    )
    named.update(src_k=0, src_v=0, dst_k=0, dst_v=0, src_idx=None, dst_idx=None, n_rows=0)
    names = transfer_kernel.arg_names
    classes = {tuple(map(int_class, layer)) for layer in layers}
    return Prepared(
        tuple(named[n] for n in names),
        tuple(names.index(n) for n in ("src_k", "src_v", "dst_k", "dst_v")),
        tuple(names.index(n) for n in ("src_idx", "dst_idx", "n_rows")),
        tuple(layers),
        len(classes) == 1,
        tile["ROWS"],
        block_quota,
        num_warps,
        plan.device,
        {},
        {},
    )


class Launcher:
    """The launch of ``plan`` as ``prepared``, with ``plan``'s indices (moved to the device).

    ``run(j)`` launches with layer ``j``'s addresses. The addresses are not specialised on
    (``do_not_specialize``), so when they all have one integer type one compiled kernel serves
    every layer, called directly (:func:`compiled_runner.direct`); it is kept in ``prepared``,
    so another batch of the same buffers (``Launcher(its_plan, prepared)``) with indices of the
    same specialization calls it from its first launch: Triton's argument binding and cache
    lookup run once per specialization of ``prepared``, not once per batch or layer.
    """

    def __init__(self, plan: CopyPlan, prepared: Prepared) -> None:
        assert plan.num_items > 0
        self.prepared = prepared
        args = list(prepared.args)
        src, dst = _indices(plan)
        for slot, value in zip(prepared.index_slots, (src, dst, plan.num_items), strict=True):
            args[slot] = value
        self._args = args
        work = triton.cdiv(plan.num_items, prepared.rows) * plan.num_layers * plan.num_kv
        self._grid = (min(prepared.block_quota, work), 1, 1)  # a compiled kernel reads all three
        # the key of the kernel serving every layer; None: bind every launch
        self._key = spec_key(src, dst, plan.num_items) if prepared.reuse else None
        known = None if self._key is None else prepared.kernels.get(self._key)
        self._compiled = None if known is None else self._direct(known)

    def _direct(self, kernel: CompiledKernel) -> Callable[..., None]:
        """``direct(kernel, grid)``, bound once per specialization and grid of ``prepared``;
        bound again for every batch while a launch hook is set (the hooks then see each one)."""
        assert self._key is not None
        runners, key = self.prepared.runners, (self._key, self._grid)
        if hooked():
            return direct(kernel, self._grid, self.prepared.device)
        runner = runners.get(key)
        if runner is None:
            runner = runners[key] = direct(kernel, self._grid, self.prepared.device)
        return runner

    def run(self, j: int) -> None:
        """Launch with ``layers[j]`` on the current stream (of ``plan.device``: the device is
        made current only for the launch, and only when another one is)."""
        args = list(self._args)
        for slot, address in zip(self.prepared.address_slots, self.prepared.layers[j], strict=True):
            args[slot] = address
        device = self.prepared.device
        if device.type != "cuda" or device.index in (None, torch.cuda.current_device()):
            self._launch(args)
        else:
            with torch.cuda.device(device):
                self._launch(args)

    def _launch(self, args: list[object]) -> None:
        if self._compiled is not None:
            try:
                self._compiled(*args)
                return
            except (TypeError, IndexError):  # a Triton whose compiled kernels take other
                if self._key is not None:  # arguments: bind every launch, keep none
                    self.prepared.kernels.pop(self._key, None)
                    self.prepared.runners.pop((self._key, self._grid), None)
                self._compiled = self._key = None
        kernel = transfer_kernel[self._grid](*args, num_warps=self.prepared.num_warps)
        if self._key is not None and isinstance(kernel, CompiledKernel):  # None: interpreting
            self.prepared.kernels[self._key] = kernel
            self._compiled = self._direct(kernel)


class PreparedLaunches:
    """The launches :func:`launch` prepared, by everything :func:`prepare` reads of a plan
    (its four addresses, both sides' geometry, bounds and kind, its shape, its device) and the
    launch options: an op called again on the same buffers (every all-layer backup of a pool
    pair) skips :func:`prepare` and, with indices of the same specialization, Triton's binding.
    At most ``limit`` kept (all dropped when full: buffers come and go rarely)."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._by_key: dict[tuple[object, ...], Prepared] = {}

    def get(self, plan: CopyPlan, block_quota: int, num_warps: int) -> Prepared:
        layer = addresses(plan)
        src, dst = plan.src, plan.dst
        key = (layer, src.geometry, dst.geometry, src.num_items, dst.num_items, src.is_table,
               dst.is_table, plan.num_kv, plan.num_layers, plan.heads, plan.chunk, plan.device,
               block_quota, num_warps)  # fmt: skip
        prepared = self._by_key.get(key)
        if prepared is None:
            if len(self._by_key) >= self.limit:
                self._by_key.clear()
            prepared = prepare(plan, [layer], block_quota, num_warps)
            self._by_key[key] = prepared
        return prepared


PREPARED = PreparedLaunches()


def launch(plan: CopyPlan, block_quota: int, num_warps: int) -> None:
    """Run ``plan`` with the Triton kernel on ``plan.device`` (the CPU only when interpreting)."""
    if plan.num_items == 0:
        return
    Launcher(plan, PREPARED.get(plan, block_quota, num_warps)).run(0)

"""Raw KV buffers in every layout, as views of preallocated arenas, and scattered index sets.

The "near" side is the device KV pool (one ``[slots, H, D]`` bf16 tensor per layer, as the device
pools hold it); the "far" side is the host pool in the layout under test (or, for device-to-device
runs, a second pool on the GPU). All buffers are views into uint8 arenas allocated once, so a
configuration costs no allocation and no pinning. Head dim is 128 (256 B of bf16 per head), so
``head_num = item // 256``; MLA rows are ``[slots, 1, item // 2]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from _common import device_arena, host_arena

HEAD_BYTES = 256


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration; ``item`` is the bytes of one token in one layer."""

    item: int
    page_size: int
    tokens: int
    layers: int
    pool_factor: int = 2

    def __post_init__(self) -> None:
        if self.item % 8 or self.tokens % self.page_size or self.tokens < self.page_size:
            raise ValueError(f"bad shape {self}: item % 8 == 0 and whole pages of tokens needed")

    @property
    def head_num(self) -> int:
        return max(1, self.item // HEAD_BYTES) if self.item % HEAD_BYTES == 0 else 1

    @property
    def host_slots(self) -> int:
        return self.pool_factor * self.tokens

    @property
    def dev_slots(self) -> int:  # plus the reserved padding page
        return self.host_slots + self.page_size

    @property
    def far_bytes(self) -> int:
        return 2 * self.layers * self.host_slots * self.item

    @property
    def near_bytes(self) -> int:
        return 2 * self.layers * self.dev_slots * self.item


def _bf16(region: torch.Tensor, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    numel = 1
    for d in shape:
        numel *= d
    return region[offset : offset + 2 * numel].view(torch.bfloat16).view(shape)


def _ptr_table(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    return ptrs.view(torch.uint64).to(device)


def _scatter(slots: int, tokens: int, page_size: int, first: int, gen: torch.Generator):
    """``tokens`` slot indices: random whole pages of ``[first, first + slots)``, shuffled."""
    pages = torch.randperm(slots // page_size, generator=gen)[: tokens // page_size]
    idx = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)
    return idx.to(torch.int64) + first


@dataclass(frozen=True)
class IndexSet:
    far: torch.Tensor  # int64 [tokens] on the kernel device
    near: torch.Tensor
    far_cpu: torch.Tensor  # the same, on CPU (the direct ops plan runs on the host)
    near_cpu: torch.Tensor


class Pools:
    """Every layout's view of the two arenas for one :class:`Shape`.

    Parameters
    ----------
    shape : the configuration.
    near_region, far_region : uint8 arenas with at least ``near_bytes`` / ``far_bytes`` bytes;
        near on the GPU (or CPU), far on the host (pinned) or on the GPU for D2D runs.
    n_sets : number of index sets; call ``k`` uses set ``k % n_sets`` and layer ``k % layers``.
    sort : issue the pairs sorted by far index, as HiCacheController does (else in random order).
    """

    def __init__(
        self,
        shape: Shape,
        near_region: torch.Tensor,
        far_region: torch.Tensor,
        n_sets: int,
        seed: int = 0,
        sort: bool = True,
    ):
        s, L, H = shape, shape.layers, shape.head_num
        self.shape, self.item = s, s.item
        self.layout_dim = s.item * L
        self.kernel_device = near_region.device
        D, S, P, ps = s.item // (2 * H), s.host_slots, s.host_slots // s.page_size, s.page_size
        per_layer = s.dev_slots * s.item
        rows = s.dev_slots
        self.near_k = [_bf16(near_region, i * per_layer, (rows, H, D)) for i in range(L)]
        self.near_v = [_bf16(near_region, (L + i) * per_layer, (rows, H, D)) for i in range(L)]
        self.near_kv = [_bf16(near_region, i * per_layer, (rows, 1, H * D)) for i in range(L)]
        half = L * S * s.item
        self.far = {}
        for name, off in (("k", 0), ("v", half)):
            self.far[name + "_lf"] = _bf16(far_region, off, (L, S, H, D))
            self.far[name + "_pf"] = _bf16(far_region, off, (S, L, H, D))
            self.far[name + "_ph"] = _bf16(far_region, off, (P, H, ps, L, D))
            self.far[name + "_pfd"] = _bf16(far_region, off, (P, L, ps, H, D))
        self.far["kv_lf"] = _bf16(far_region, 0, (L, S, 1, H * D))
        self.far["kv_pf"] = _bf16(far_region, 0, (S, L, 1, H * D))
        dev = self.kernel_device
        self.ptrs = {
            "near_k": _ptr_table(self.near_k, dev),
            "near_v": _ptr_table(self.near_v, dev),
            "near_kv": _ptr_table(self.near_kv, dev),
            "far_k": _ptr_table(list(self.far["k_lf"]), dev),
            "far_v": _ptr_table(list(self.far["v_lf"]), dev),
            "far_kv": _ptr_table(list(self.far["kv_lf"]), dev),
        }
        gen = torch.Generator().manual_seed(seed)
        self.sets = [self._index_set(gen, sort) for _ in range(n_sets)]

    def _index_set(self, gen: torch.Generator, sort: bool) -> IndexSet:
        s = self.shape
        far = _scatter(s.host_slots, s.tokens, s.page_size, 0, gen)
        near = _scatter(s.host_slots, s.tokens, s.page_size, s.page_size, gen)
        if sort:  # as HiCacheController issues a batch: pairs sorted by the host (far) index
            far, order = torch.sort(far)
            near = near[order]
        dev = self.kernel_device
        return IndexSet(far.to(dev), near.to(dev), far, near)

    def at(self, k: int) -> tuple[int, IndexSet]:
        """Layer and index set of call ``k``."""
        return k % self.shape.layers, self.sets[k % len(self.sets)]


class Arenas:
    """The preallocated memory every configuration is a view of.

    ``near`` on ``device``; ``far`` on the host (pinned when ``device`` is CUDA); ``far_dev``, for
    device-to-device runs, a second arena on ``device`` (None unless ``d2d``).
    """

    def __init__(
        self, shapes: list[Shape], device: torch.device, d2d: bool, pinning: str = "touch"
    ):
        near = max(s.near_bytes for s in shapes)
        far = max(s.far_bytes for s in shapes)
        self.near = device_arena(near, device)
        self.far = host_arena(far, device, pinning)
        self.far_dev = device_arena(far, device) if d2d else None

    @property
    def nbytes(self) -> dict[str, int]:
        parts = {"near": self.near, "far": self.far, "far_dev": self.far_dev}
        return {k: 0 if t is None else t.numel() for k, t in parts.items()}

    def pools(self, shape: Shape, *, d2d: bool, n_sets: int, sort: bool = True) -> Pools:
        far = self.far_dev if d2d else self.far
        assert far is not None, "arenas allocated without d2d"
        return Pools(shape, self.near, far, n_sets, sort=sort)

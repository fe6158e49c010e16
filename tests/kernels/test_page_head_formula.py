"""page_head against the DESIGN byte formula, written out per item, head and layer.

Item ``i``, head ``h``, layer ``l`` of a ``[pages, H, page_size, L, D]`` buffer starts at byte
``(i // ps) * ps * layout_dim + h * ps * layout_dim / H + (i % ps) * layout_dim / H
+ l * item_size / H`` and spans ``item_size / H`` bytes.
"""

from __future__ import annotations

import pytest
import torch

import hicache.kernels as K
from tests.kernels.cases import poisoned, random_bytes, table


def ph_offset(
    i: int, h: int, layer: int, item_size: int, layout_dim: int, ps: int, heads: int
) -> int:
    return (
        (i // ps) * ps * layout_dim
        + h * ps * layout_dim // heads
        + (i % ps) * layout_dim // heads
        + layer * item_size // heads
    )


GEOMETRIES = [  # (page_size, heads, head_dim, layers, dtype)
    (1, 2, 4, 2, torch.float16),
    (4, 3, 8, 3, torch.bfloat16),
    (8, 4, 2, 2, torch.float32),
    (2, 2, 8, 5, torch.uint8),
    (2, 4, 2, 2, torch.float16),  # 4-byte head slices
]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_ph_lf_reads_the_design_offsets(geometry):
    ps, heads, head_dim, layers, dtype = geometry
    gen = torch.Generator().manual_seed(ps)
    pages, layer = 6, layers - 1
    src_k = random_bytes((pages, heads, ps, layers, head_dim), dtype, gen)
    src_v = random_bytes((pages, heads, ps, layers, head_dim), dtype, gen)
    dst_k, dst_v = poisoned((10, heads, head_dim), dtype), poisoned((10, heads, head_dim), dtype)
    item_size = dst_k[0].numel() * dst_k.element_size()
    layout_dim, chunk = item_size * layers, item_size // heads
    src_idx = torch.randperm(pages * ps, generator=gen)[:6]
    dst_idx = torch.randperm(10, generator=gen)[:6]
    want = [d.view(torch.uint8).flatten().clone() for d in (dst_k, dst_v)]
    for src, out in zip((src_k, src_v), want, strict=True):
        flat = src.view(torch.uint8).flatten()
        for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
            for h in range(heads):
                at = ph_offset(s, h, layer, item_size, layout_dim, ps, heads)
                out[d * item_size + h * chunk :][:chunk] = flat[at : at + chunk]
    K.transfer_kv_per_layer_ph_lf(
        src_k, dst_k, src_v, dst_v, src_idx, dst_idx, layer, item_size, layout_dim, ps, heads
    )
    for got, out in zip((dst_k, dst_v), want, strict=True):
        assert torch.equal(got.view(torch.uint8).flatten(), out)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_lf_ph_writes_the_design_offsets(geometry):
    ps, heads, head_dim, layers, dtype = geometry
    gen = torch.Generator().manual_seed(ps + 1)
    pages, n_src = 6, 9
    src_k = [random_bytes((n_src, heads, head_dim), dtype, gen) for _ in range(layers)]
    src_v = [random_bytes((n_src, heads, head_dim), dtype, gen) for _ in range(layers)]
    dst_k = poisoned((pages, heads, ps, layers, head_dim), dtype)
    dst_v = poisoned((pages, heads, ps, layers, head_dim), dtype)
    item_size = src_k[0][0].numel() * src_k[0].element_size()
    layout_dim, chunk = item_size * layers, item_size // heads
    src_idx = torch.randperm(n_src, generator=gen)[:5]
    dst_idx = torch.randperm(pages * ps, generator=gen)[:5]
    want = [d.view(torch.uint8).flatten().clone() for d in (dst_k, dst_v)]
    for srcs, out in zip((src_k, src_v), want, strict=True):
        for layer, src in enumerate(srcs):
            flat = src.view(torch.uint8).flatten()
            for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
                for h in range(heads):
                    at = ph_offset(d, h, layer, item_size, layout_dim, ps, heads)
                    out[at : at + chunk] = flat[s * item_size + h * chunk :][:chunk]
    K.transfer_kv_all_layer_lf_ph(
        table(src_k, "cpu"),
        dst_k,
        table(src_v, "cpu"),
        dst_v,
        src_idx,
        dst_idx,
        item_size,
        layout_dim,
        layers,
        ps,
        heads,
    )
    for got, out in zip((dst_k, dst_v), want, strict=True):
        assert torch.equal(got.view(torch.uint8).flatten(), out)

"""Bytes per token (KV pools) and per request (recurrent state) of each pool class, for a model of
each family that uses it, computed from the pools themselves (one page of slots each, on CPU).

Usage: ``python benchmarks/pool_sizes.py`` (prints the README's pool table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _common import format_table, import_hicache

PAGE = 64
BF16 = torch.bfloat16
CPU = "cpu"


def _per_token(pool: Any) -> int:
    """Bytes one token slot takes over all layers and buffers."""
    size = pool.get_kv_size_bytes()
    total = sum(size) if isinstance(size, tuple) else size
    return int(total) // pool.num_slots


def _rows(p: Any) -> list[tuple[str, str, str, Callable[[], str]]]:
    mib = 1 << 20
    gdn = (
        p.MambaStateParams(  # Qwen3-Next-80B-A3B: 36 GDN layers, conv 8192 x 3, 32 x 128 x 128 fp32
            layers=[i for i in range(48) if i % 4 != 3],
            conv=[(8192, 3)],
            temporal=(32, 128, 128),
            conv_dtype=BF16,
            temporal_dtype=torch.float32,
        )
    )
    return [
        (
            "MHATokenToKVPool",
            "Llama-3-8B (32 L, 8 x 128)",
            "token",
            lambda: f"{_per_token(p.MHATokenToKVPool(PAGE, PAGE, BF16, 8, 128, 32, 'cpu')):,}",
        ),
        (
            "MHATokenToKVPoolFP4",
            "Llama-3-8B, FP4 KV",
            "token",
            lambda: f"{_per_token(p.MHATokenToKVPoolFP4(PAGE, PAGE, BF16, 8, 128, 32, 'cpu')):,}",
        ),
        (
            "MLATokenToKVPool",
            "DeepSeek-V3 (61 L, 512 + 64)",
            "token",
            lambda: f"{_per_token(p.MLATokenToKVPool(PAGE, PAGE, BF16, 512, 64, 61, 'cpu')):,}",
        ),
        (
            "MLATokenToKVPoolFP4",
            "DeepSeek-V3, FP4 KV",
            "token",
            lambda: f"{_per_token(p.MLATokenToKVPoolFP4(PAGE, PAGE, BF16, 512, 64, 61, 'cpu')):,}",
        ),
        (
            "NSATokenToKVPool",
            "DeepSeek-V3.2 (MLA + FP8 index K)",
            "token",
            lambda: (
                f"{_per_token(p.NSATokenToKVPool(PAGE, PAGE, 512, BF16, 64, 61, 'cpu', 128)):,}"
            ),
        ),
        (
            "DoubleSparseTokenToKVPool",
            "Llama-2-7B (32 L, 32 x 128, 16 labels)",
            "token",
            lambda: (
                f"{_per_token(p.DoubleSparseTokenToKVPool(PAGE, PAGE, BF16, 32, 128, 32, CPU, 16)):,}"  # noqa: E501
            ),
        ),
        (
            "SWAKVPool",
            "gpt-oss-120b (18 full + 18 SWA L, 8 x 64)",
            "token (full; SWA x last 128)",
            lambda: _swa(p),
        ),
        (
            "HybridLinearKVPool",
            "Qwen3-Next-80B (12 full L, 2 x 256)",
            "token",
            lambda: f"{_per_token(_hybrid(p, gdn).full_kv_pool):,}",
        ),
        (
            "MambaPool",
            "Qwen3-Next-80B (36 GDN L)",
            "request",
            lambda: f"{gdn.mamba_cache_per_req:,} ({gdn.mamba_cache_per_req / mib:.1f} MiB)",
        ),
    ]


def _swa(p: Any) -> str:
    pool = p.SWAKVPool(
        PAGE, PAGE, PAGE, BF16, 8, 64, list(range(0, 36, 2)), list(range(1, 36, 2)), "cpu"
    )
    return f"{_per_token(pool.full_kv_pool):,} + {_per_token(pool.swa_kv_pool):,}"


def _hybrid(p: Any, gdn: Any) -> Any:
    mamba = p.MambaPool(size=1, cache_params=gdn, device="cpu")
    full = [i for i in range(48) if i % 4 == 3]
    return p.HybridLinearKVPool(PAGE, BF16, PAGE, 2, 256, full, "cpu", mamba)


def main() -> None:
    p = import_hicache("pools")
    rows = [(cls, model, unit, size()) for cls, model, unit, size in _rows(p)]
    print(format_table(["pool", "model", "per", "bytes"], rows))


if __name__ == "__main__":
    main()

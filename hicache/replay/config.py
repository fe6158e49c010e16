"""Settings of one replay: cache sizes and policies, KV geometry, batching and the cost model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from hicache.checks import check_int
from hicache.engine.config import check_real
from hicache.metrics import check_endpoint
from hicache.radix import HiCacheConfig, RadixCacheConfig
from hicache.replay.trace import BLOCK_TOKENS
from hicache.stack import KVStack, build_kv_stack

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU: the smallest KV a token can have (1 layer, one 4-wide fp16 head: 16 bytes), so a trace's
# whole working set fits in RAM; the hit rates do not depend on the geometry. CUDA: the KV of
# Llama-3-8B (32 layers, 8 KV heads x 128, bf16: 128 KiB per token).
GEOMETRY = {
    "cpu": {"layers": 1, "kv_heads": 1, "head_dim": 4, "dtype": "float16"},
    "cuda": {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"},
}


@dataclass(frozen=True)
class ReplayConfig:
    """One replay. Sizes in tokens; ``host_ratio`` 0 means no host tier (a device-only
    ``RadixCache``), else host slots = ratio x device slots (> 1). ``prefill_tps`` and
    ``decode_step_ms`` are the cost model's compute; ``h2d_gbps``/``d2h_gbps`` its transfer
    bandwidth (None: measured on these pools before the replay, ``cost.measure_bandwidth``).
    ``metrics_port``: serve the replayed cache's Prometheus metrics on ``metrics_host`` at this
    port while it runs (None: no server)."""

    device_tokens: int = 1 << 20
    host_ratio: float = 4.0
    page_size: int = 16
    max_running: int = 16
    max_prefill_tokens: int = 8192
    layers: int = 1
    kv_heads: int = 1
    head_dim: int = 4
    dtype: str = "float16"
    device: str = "cpu"
    eviction_policy: str = "lru"
    write_policy: str = "write_through"
    io_backend: str = "auto"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    block_tokens: int = BLOCK_TOKENS
    prefill_tps: float = 20000.0
    decode_step_ms: float = 25.0
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in ("device_tokens", "page_size", "max_running", "max_prefill_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("layers", "kv_heads", "head_dim", "block_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("load_back_threshold", self.load_back_threshold, minimum=0)
        check_real("host_ratio", self.host_ratio)
        check_real("prefill_tps", self.prefill_tps, inclusive=False)
        check_real("decode_step_ms", self.decode_step_ms)
        for name in ("h2d_gbps", "d2h_gbps"):
            if getattr(self, name) is not None:
                check_real(name, getattr(self, name), inclusive=False)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.metrics_port is not None:
            check_endpoint(self.metrics_port, self.metrics_host)
        RadixCacheConfig(self.page_size, self.eviction_policy)
        self.hicache()

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ReplayConfig:
        """Options that are None take the defaults; the geometry those of ``args['device']``."""
        device = args.get("device") or "cpu"
        geometry = GEOMETRY["cuda" if device.startswith("cuda") else "cpu"]
        names = {f.name for f in fields(cls)}
        given = {k: v for k, v in args.items() if k in names and v is not None}
        return cls(**{**geometry, **given, "device": device})

    def with_(self, **changes: Any) -> ReplayConfig:
        return replace(self, **changes)

    @property
    def device_slots(self) -> int:
        return -(-self.device_tokens // self.page_size) * self.page_size

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token over all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPES[self.dtype].itemsize

    def hicache(self) -> HiCacheConfig | None:
        if self.host_ratio == 0:
            return None
        return HiCacheConfig(
            hicache_ratio=self.host_ratio,
            write_policy=self.write_policy,
            io_backend=self.io_backend,
            mem_layout=self.mem_layout,
            load_back_threshold=self.load_back_threshold,
        )

    def build_stack(
        self, max_context_len: int, size: int | None = None, kv_events: Any = None
    ) -> KVStack:
        """The real pools and cache of this replay (``size``: device slots, default ours),
        its KV events to ``kv_events`` (``build_kv_stack``'s)."""
        return build_kv_stack(
            layer_num=self.layers,
            head_num=self.kv_heads,
            head_dim=self.head_dim,
            dtype=DTYPES[self.dtype],
            size=self.device_slots if size is None else size,
            max_requests=self.max_running + 1,
            max_context_len=max_context_len,
            page_size=self.page_size,
            device=self.device,
            hicache=self.hicache(),
            eviction_policy=self.eviction_policy,
            kv_events=kv_events,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

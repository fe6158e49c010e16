"""Settings of one replay: cache sizes and policies, KV geometry, batching and the cost model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from hicache.backends import StorageConfig
from hicache.backends.page_sum import trailer_bytes
from hicache.checks import check_choice, check_int
from hicache.controller import TIERINGS
from hicache.engine.config import check_real
from hicache.metrics import check_endpoint
from hicache.radix import HiCacheConfig, RadixCacheConfig
from hicache.replay.hybrid import (
    DEFAULT_STATE_MODEL,
    build_hybrid_stack,
    check_hybrid,
    state_bytes_of,
)
from hicache.replay.trace import BLOCK_TOKENS
from hicache.stack import KVStack, build_kv_stack

STORAGES = ("none", "memory", "file")
# The storage read bandwidth of the clock when not given: the file store's disk read measured
# on an H100 machine (README, "TTFT per tier on a GPU": 64k-token prefix, 1.1 GB/s).
STORAGE_GBPS = 1.1
# What the bandwidth probe changes: a plain inclusive host tier, no storage (``cost.py``).
PROBE_TIERS = {
    "storage": "none",
    "storage_capacity": None,
    "storage_tiering": "inclusive",
    "tiering": "inclusive",
}
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
    ``RadixCache``), else host slots = ratio x device slots (any ratio > 0). ``storage``: the
    storage tier below the host (``none``, ``memory`` or ``file``), capped at
    ``storage_capacity`` tokens (None: no cap for ``memory``, the file store's default cap);
    ``tiering`` / ``storage_tiering``: device<->host and host<->storage policy
    (``hicache.controller.TIERINGS``). ``prefill_tps`` and ``decode_step_ms`` are the cost
    model's compute; ``h2d_gbps``/``d2h_gbps`` its transfer bandwidth (None: measured on these
    pools before the replay, ``cost.measure_bandwidth``), ``storage_gbps`` its storage read
    bandwidth. ``metrics_port``: serve the replayed cache's Prometheus metrics on
    ``metrics_host`` at this port while it runs (None: no server).

    A hybrid model (``hicache.replay.hybrid``): ``layers_pattern`` one of ``F``/``S``/``L`` per
    layer (None: full attention), ``window`` the ``S`` layers' ``W``, ``state_slots`` the
    device's recurrent-state slots with ``L`` layers (None: the engine's default),
    ``checkpoint`` the policy (``parse_checkpoint``), ``state_bytes`` the bytes of one state
    of the modelled model."""

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
    storage: str = "none"
    storage_capacity: int | None = None
    tiering: str = "inclusive"
    storage_tiering: str = "inclusive"
    storage_gbps: float = STORAGE_GBPS
    layers_pattern: str | None = None
    window: int = 128
    state_slots: int | None = None
    checkpoint: str = "finish+branch"
    state_bytes: int = state_bytes_of(DEFAULT_STATE_MODEL)

    def __post_init__(self) -> None:
        for name in ("device_tokens", "page_size", "max_running", "max_prefill_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("layers", "kv_heads", "head_dim", "block_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("load_back_threshold", self.load_back_threshold, minimum=0)
        check_real("host_ratio", self.host_ratio)
        self._check_tiers()
        check_real("prefill_tps", self.prefill_tps, inclusive=False)
        check_real("decode_step_ms", self.decode_step_ms)
        check_real("storage_gbps", self.storage_gbps, inclusive=False)
        for name in ("h2d_gbps", "d2h_gbps"):
            if getattr(self, name) is not None:
                check_real(name, getattr(self, name), inclusive=False)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.metrics_port is not None:
            check_endpoint(self.metrics_port, self.metrics_host)
        RadixCacheConfig(self.page_size, self.eviction_policy)
        check_hybrid(self)
        self.hicache()

    def _check_tiers(self) -> None:
        """The storage tier and the tiering policies need the tier below them."""
        check_choice("storage", self.storage, STORAGES)
        check_choice("tiering", self.tiering, TIERINGS)
        check_choice("storage_tiering", self.storage_tiering, TIERINGS)
        if self.host_ratio == 0 and (self.storage != "none" or self.tiering != "inclusive"):
            what = f"storage={self.storage!r}" if self.storage != "none" else "tiering"
            raise ValueError(f"{what} needs a host tier (host_ratio > 0), got host_ratio=0")
        if self.storage == "none":
            for name, default in (("storage_capacity", None), ("storage_tiering", "inclusive")):
                if getattr(self, name) != default:
                    raise ValueError(f"{name} needs a storage tier (storage 'memory' or 'file')")
        elif self.storage_capacity is not None:
            check_int("storage_capacity", self.storage_capacity, minimum=self.page_size)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ReplayConfig:
        """Options that are None take the defaults; the geometry those of ``args['device']``."""
        device = args.get("device") or "cpu"
        geometry = GEOMETRY["cuda" if device.startswith("cuda") else "cpu"]
        names = {f.name for f in fields(cls)}
        given = {k: v for k, v in args.items() if k in names and v is not None}
        pattern = given.get("layers_pattern")
        if isinstance(pattern, str) and pattern and "layers" not in given:
            given["layers"] = len(pattern)  # the pattern sets the layer count
        if isinstance(given.get("state_bytes"), str):
            given["state_bytes"] = state_bytes_of(given["state_bytes"])
        return cls(**{**geometry, **given, "device": device})

    def with_(self, **changes: Any) -> ReplayConfig:
        return replace(self, **changes)

    def full_attention(self) -> ReplayConfig:
        """This config with every attention layer ``F`` and no other layer (the bandwidth
        probe's: a copy's cost per byte does not depend on the layer kind)."""
        layers = self.layers if self.layers_pattern is None else self.attention_layers
        return replace(self, layers=layers, layers_pattern=None, state_slots=None)

    @property
    def hybrid(self) -> bool:
        """Whether ``layers_pattern`` has ``S`` or ``L`` layers."""
        return bool(set(self.layers_pattern or "") - {"F"})

    @property
    def attention_layers(self) -> int:
        """Layers with KV (``F`` and ``S``)."""
        return self.layers - (self.layers_pattern or "").count("L")

    @property
    def max_requests(self) -> int:
        """Rows of the request table: ``max_running`` and one spare."""
        return self.max_running + 1

    @property
    def device_slots(self) -> int:
        return -(-self.device_tokens // self.page_size) * self.page_size

    @property
    def host_tokens(self) -> int:
        """Host slots (the pools' rule: ratio x device slots, up to whole pages)."""
        return -(-int(self.device_slots * self.host_ratio) // self.page_size) * self.page_size

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token over all attention layers (K and V)."""
        return (
            2 * self.attention_layers * self.kv_heads * self.head_dim * DTYPES[self.dtype].itemsize
        )

    @property
    def storage_page_bytes(self) -> int:
        """Bytes a page takes in storage: its K and V objects, each with its trailer."""
        return self.page_size * self.token_bytes + 2 * trailer_bytes(self.layers)

    def storage_config(self, root: str | None = None) -> StorageConfig | None:
        """The storage tier (None without one): prefetches wait until complete and load every
        hit (``cost_aware`` off: the replay models compute, it does not measure it), the byte
        cap is ``storage_capacity`` whole pages; ``root``: the file store's directory (unused
        by ``memory``)."""
        if self.storage == "none":
            return None
        extra: dict[str, Any] = {"root": root} if self.storage == "file" and root else {}
        if self.storage_capacity is not None:
            pages = self.storage_capacity // self.page_size
            extra["max_bytes"] = pages * self.storage_page_bytes
        return StorageConfig(
            backend=self.storage,
            extra_config=extra,
            model_id="hicache-replay",
            prefetch_policy="wait_complete",
            cost_aware=False,
            tiering=self.storage_tiering,
        )

    def hicache(self, storage_root: str | None = None) -> HiCacheConfig | None:
        if self.host_ratio == 0:
            return None
        return HiCacheConfig(
            hicache_ratio=self.host_ratio,
            write_policy=self.write_policy,
            io_backend=self.io_backend,
            mem_layout=self.mem_layout,
            load_back_threshold=self.load_back_threshold,
            storage=self.storage_config(storage_root),
            tiering=self.tiering,
        )

    def build_stack(
        self,
        max_context_len: int,
        size: int | None = None,
        kv_events: Any = None,
        storage_root: str | None = None,
    ) -> KVStack:
        """The real pools and cache of this replay (``size``: device slots, default ours),
        its KV events to ``kv_events`` (``build_kv_stack``'s), the file store under
        ``storage_root`` (required with ``storage='file'``; the caller removes it)."""
        if self.storage == "file" and storage_root is None:
            raise ValueError("storage='file' needs a directory: pass storage_root")
        if self.hybrid:
            cfg = self if size is None else self.with_(device_tokens=size)
            return build_hybrid_stack(cfg, max_context_len, kv_events, storage_root)
        return build_kv_stack(
            layer_num=self.layers,
            head_num=self.kv_heads,
            head_dim=self.head_dim,
            dtype=DTYPES[self.dtype],
            size=self.device_slots if size is None else size,
            max_requests=self.max_requests,
            max_context_len=max_context_len,
            page_size=self.page_size,
            device=self.device,
            hicache=self.hicache(storage_root),
            eviction_policy=self.eviction_policy,
            kv_events=kv_events,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

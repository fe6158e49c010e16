"""Settings of the ``hicache bench`` main job: workload, model and cache, validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from hicache.engine import CacheSpec, EngineConfig
from hicache.model import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CPU_DEFAULTS: dict[str, Any] = {
    "users": 12, "rounds": 4, "system_len": 256, "prompt_len": 96, "answer_len": 8,
    "layers": 4, "heads": 8, "kv_heads": 4, "head_dim": 32, "intermediate": 256,
    "vocab": 512, "dtype": "float32", "device_tokens": 2048, "max_running": 4,
    "max_prefill_tokens": 512,
}
CUDA_DEFAULTS: dict[str, Any] = {  # Llama-3-8B attention geometry, light MLPs
    "users": 32, "rounds": 4, "system_len": 2048, "prompt_len": 512, "answer_len": 32,
    "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 1024,
    "vocab": 1024, "dtype": "bfloat16", "device_tokens": 32768, "max_running": 16,
    "max_prefill_tokens": 4096,
}


@dataclass(frozen=True)
class BenchConfig:
    """One bench run. Sizes are tokens; ``arrival_rate`` is first-round users per second
    (0: all at once); every later round of a user is sent when its previous answer is done."""

    users: int
    rounds: int
    system_len: int
    prompt_len: int
    answer_len: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str
    device_tokens: int
    max_running: int
    max_prefill_tokens: int
    device: str = "cpu"
    attention: str = "mha"
    arrival_rate: float = 0.0
    host_ratio: float = 4.0
    page_size: int = 1
    eviction_policy: str = "lru"
    write_policy: str = "write_through"
    io_backend: str = "kernel"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    seed: int = 0
    out_dir: str = "bench_out"

    def __post_init__(self) -> None:
        positive = ("users", "rounds", "prompt_len", "answer_len", "layers", "heads", "kv_heads",
                    "head_dim", "intermediate", "vocab", "device_tokens", "max_running",
                    "max_prefill_tokens", "page_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{_flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("system_len", "arrival_rate", "load_back_threshold"):
            if getattr(self, name) < 0:
                raise ValueError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.host_ratio < 1:
            raise ValueError(f"--host-ratio must be >= 1, got {self.host_ratio}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: CUDA is not available")
        # Build the component configs now, so their checks run before any work starts.
        self.model_config()
        self.cache_spec("hiradix")
        self.engine_config()

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> BenchConfig:
        """Fill unset (None) options with the CPU or CUDA defaults of ``args['device']``."""
        device = args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        defaults = CUDA_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS
        names = {f.name for f in fields(cls)}
        given = {k: v for k, v in args.items() if k in names and v is not None}
        return cls(**{**defaults, **given, "device": device})

    @property
    def max_context_len(self) -> int:
        return self.system_len + self.rounds * (self.prompt_len + self.answer_len) + 1

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab, num_layers=self.layers, num_heads=self.heads,
            num_kv_heads=self.kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate, attention=self.attention,
            dtype=DTYPES[self.dtype], seed=self.seed,
        )

    def cache_spec(self, kind: str) -> CacheSpec:
        tokens = -(-self.device_tokens // self.page_size) * self.page_size
        return CacheSpec(
            kind=kind, device_tokens=tokens, page_size=self.page_size,
            max_context_len=self.max_context_len, max_requests=self.max_running + 1,
            eviction_policy=self.eviction_policy, hicache_ratio=self.host_ratio,
            write_policy=self.write_policy, io_backend=self.io_backend,
            mem_layout=self.mem_layout, load_back_threshold=self.load_back_threshold,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.max_running, self.max_prefill_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")

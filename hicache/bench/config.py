"""Settings of the ``hicache bench`` main job: workload, model and cache, validated once."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from hicache.backends import StorageConfig
from hicache.backends.config import PREFETCH_POLICIES
from hicache.bench import model_flags
from hicache.bench.checks import check_count, check_device, check_layers_pattern, flag
from hicache.bench.model_flags import DTYPES, QWEN3_NEXT_STATE_BYTES
from hicache.bench.presets import CPU_DEFAULTS, CUDA_DEFAULTS
from hicache.engine import CacheSpec, EngineConfig
from hicache.engine.config import check_real
from hicache.kv_events import KVEventsConfig
from hicache.metrics import check_endpoint
from hicache.model import ModelConfig
from hicache.radix import HiCacheConfig

ARRIVALS = ("uniform", "poisson")
STORAGE_BACKENDS = ("file", "mooncake")  # ``memory`` cannot outlive the process
# Storage objects are pages: one token per object would be one file (or Mooncake key) each.
STORAGE_DEFAULTS: dict[str, Any] = {"page_size": 64}
MODEL_ID = "hicache-tiny"  # the bench's models in storage keys; the revision is a digest


@dataclass(frozen=True)
class BenchConfig:
    """One bench run. Sizes are tokens; ``arrival_rate`` is first-round users per second
    (0: all at once), spaced evenly or as a Poisson process (``arrival_distribution``); every
    later round of a user is sent when its previous answer is done.
    ``threads``: torch intra-op CPU threads during the run (None: leave torch's setting).
    ``storage``: ``file`` or ``mooncake`` runs the storage bench (``bench.storage_run``)
    instead, the file store in ``storage_dir`` (None: a temporary directory), Mooncake's master
    at ``mooncake_master`` (None: ``HICACHE_MOONCAKE_MASTER_SERVER_ADDRESS``);
    ``prefetch_policy`` and ``prefetch_threshold`` go to its ``StorageConfig``; the threshold
    defaults to one 64-token page here (the library's default is SGLang's 256): each later
    turn of this workload adds about 200 new tokens, which 256 would always recompute.
    ``tp``: tensor-parallel ranks, each a process with its shard of the model and pools
    (``bench.tp_run``; on ``cuda`` rank r on ``cuda:{r % GPUs}``); ``heads``, ``kv_heads`` (MHA) and
    ``intermediate`` must be multiples of it.
    ``metrics_port``: serve Prometheus metrics on ``metrics_host`` during each run (one rank);
    ``kv_events``/``kv_events_replay``: publish KV events there (``KVEventsConfig``).
    ``layers_pattern``: one of ``F``/``S``/``L`` per layer (``ModelConfig.layer_pattern``; None:
    every layer ``F``); a hybrid one (``S`` or ``L``) runs with every tier, ``--storage``
    too. With ``L`` layers, ``state_slots`` and ``checkpoint`` (``model_flags.parse_checkpoint``;
    None: the ``CacheSpec`` defaults) say how many recurrent states the device keeps and where
    it takes them; the report counts them at ``state_bytes`` each (``bench.model_flags``)."""

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
    arrival_distribution: str = "uniform"
    host_ratio: float = 4.0
    page_size: int = 1
    eviction_policy: str = "lru"
    write_policy: str = "write_through"
    io_backend: str = "auto"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    seed: int = 0
    threads: int | None = None
    out_dir: str = "bench_out"
    storage: str | None = None
    storage_dir: str | None = None
    mooncake_master: str | None = None
    prefetch_policy: str = "timeout"
    prefetch_threshold: int = 64
    tp: int = 1
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    kv_events: str | None = None
    kv_events_replay: str | None = None
    layers_pattern: str | None = None
    state_slots: int | None = None
    checkpoint: str | None = None
    state_bytes: int = QWEN3_NEXT_STATE_BYTES

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            check_count(name, getattr(self, name), minimum=1)
        for name in ("system_len", "load_back_threshold", "seed"):
            check_count(name, getattr(self, name), minimum=0)
        if self.threads is not None:
            check_count("threads", self.threads, minimum=1)
        check_real(flag("arrival_rate"), self.arrival_rate)
        # Any host pool of at least one page, smaller than the device pool too.
        check_real(flag("host_ratio"), self.host_ratio, inclusive=False)
        if self.arrival_distribution not in ARRIVALS:
            raise ValueError(
                f"--distribution must be one of {list(ARRIVALS)}, got {self.arrival_distribution!r}"
            )
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_device(self.device)
        check_layers_pattern(self.layers_pattern, self.layers)
        model_flags.check_state_flags(self)
        self._check_storage()
        self._check_tp()
        if self.metrics_port is not None:
            check_endpoint(self.metrics_port, self.metrics_host)
            if self.tp > 1:
                raise ValueError("--metrics-port serves one cache: use it without --tp")
        # Build the component configs now, so their checks run before any work starts.
        self.model_config()
        self.cache_spec("hiradix", self.storage_config())
        self.engine_config()
        self.events_config()

    def events_config(self) -> KVEventsConfig | None:
        """``--kv-events``'s publisher or None (``ValueError``: a bad address, a replay one
        alone, or with ``--storage``/``--tp``)."""
        if self.kv_events is None:
            if self.kv_events_replay is not None:
                raise ValueError("--kv-events-replay needs --kv-events")
            return None
        if self.storage is not None or self.tp > 1:
            raise ValueError("--kv-events runs with the main bench only (no --storage, --tp)")
        return KVEventsConfig(self.kv_events, self.kv_events_replay)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> BenchConfig:
        """Fill unset (None) options with the CPU or CUDA defaults of ``args['device']``
        (and ``STORAGE_DEFAULTS`` with ``--storage``)."""
        device = args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        defaults = CUDA_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS
        if args.get("storage") is not None:
            defaults = {**defaults, **STORAGE_DEFAULTS}
        names = {f.name for f in fields(cls)}
        given = {k: v for k, v in args.items() if k in names and v is not None}
        pattern = given.get("layers_pattern")
        if isinstance(pattern, str) and pattern and "layers" not in given:
            given["layers"] = len(pattern)  # the pattern sets the layer count
        return cls(**{**defaults, **given, "device": device})

    @property
    def max_context_len(self) -> int:
        return self.system_len + self.rounds * (self.prompt_len + self.answer_len) + 1

    @property
    def max_requests(self) -> int:
        """Rows of the request pool: ``max_running`` and one more for admission."""
        return self.max_running + 1

    def model_config(self) -> ModelConfig:
        return model_flags.model_config(self)

    @property
    def hybrid(self) -> bool:
        """Whether ``--layers-pattern`` has ``S`` or ``L`` layers."""
        return self.model_config().is_hybrid

    def _check_storage(self) -> None:
        if self.storage is not None and self.storage not in STORAGE_BACKENDS:
            raise ValueError(
                f"--storage must be one of {list(STORAGE_BACKENDS)}, got {self.storage!r}"
            )
        for name, backend in (("storage_dir", "file"), ("mooncake_master", "mooncake")):
            if getattr(self, name) is not None and self.storage != backend:
                raise ValueError(f"{flag(name)} needs --storage {backend}")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"--prefetch-policy must be one of {list(PREFETCH_POLICIES)}, "
                f"got {self.prefetch_policy!r}"
            )
        check_count("prefetch_threshold", self.prefetch_threshold, minimum=1)

    def _check_tp(self) -> None:
        """``--tp`` a positive int that splits the model evenly, on ``cpu`` or ``cuda``."""
        check_count("tp", self.tp, minimum=1)
        if self.tp == 1:
            return
        split = ["heads", "intermediate"] + (["kv_heads"] if self.attention == "mha" else [])
        for name in split:
            if getattr(self, name) % self.tp:
                raise ValueError(
                    f"{flag(name)} ({getattr(self, name)}) must be a multiple of --tp ({self.tp})"
                )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(
                f"--tp {self.tp} puts rank r on cuda:{{r % GPUs}} itself: needs --device cuda "
                f"or cpu, got {self.device!r}"
            )

    def model_revision(self) -> str:
        """A digest of everything that makes the model's KV: its config (seed included)."""
        model = {k: str(v) for k, v in asdict(self.model_config()).items()}
        return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:16]

    def storage_config(self, root: str | None = None) -> StorageConfig | None:
        """The storage tier of ``--storage`` (None without): a file store under ``root``, or
        Mooncake at ``--mooncake-master`` (else ``HICACHE_MOONCAKE_*`` from the environment);
        keys fingerprinted by ``MODEL_ID`` and ``model_revision``."""
        if self.storage is None:
            return None
        extra: dict[str, Any] = {}
        if self.storage == "file" and root is not None:
            extra["root"] = root
        if self.mooncake_master is not None:
            extra["master_server_address"] = self.mooncake_master
        return StorageConfig(
            backend=self.storage,
            extra_config=extra,
            model_id=MODEL_ID,
            model_revision=self.model_revision(),
            prefetch_policy=self.prefetch_policy,
            prefetch_threshold=self.prefetch_threshold,
        )

    def cache_spec(
        self, kind: str, storage: StorageConfig | None = None, kv_events: Any = None
    ) -> CacheSpec:
        tokens = -(-self.device_tokens // self.page_size) * self.page_size
        return CacheSpec(
            kind=kind,
            device_tokens=tokens,
            page_size=self.page_size,
            max_context_len=self.max_context_len,
            max_requests=self.max_requests,
            eviction_policy=self.eviction_policy,
            hicache=HiCacheConfig(
                hicache_ratio=self.host_ratio,
                write_policy=self.write_policy,
                io_backend=self.io_backend,
                mem_layout=self.mem_layout,
                load_back_threshold=self.load_back_threshold,
                storage=storage,
            ),
            kv_events=kv_events,
            **model_flags.state_settings(self),
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.max_running, self.max_prefill_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_memory(self) -> None:
        """``ValueError`` when the pools do not fit in memory (``model_flags.check_memory``)."""
        model_flags.check_memory(self)


_POSITIVE = (
    "users",
    "rounds",
    "prompt_len",
    "answer_len",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate",
    "vocab",
    "device_tokens",
    "max_running",
    "max_prefill_tokens",
    "page_size",
)

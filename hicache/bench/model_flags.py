"""The model ``hicache bench`` runs and the flags of a hybrid one: ``--layers-pattern``,
``--state-slots`` and ``--checkpoint`` (how many recurrent states a model with ``L`` layers
may keep, and where it takes them), ``--state-bytes`` (what one state stands for in the
report); and whether the pools fit in memory. Each function takes ``cfg``, a
``bench.config.BenchConfig`` (typed ``Any``: that module imports this one)."""

from __future__ import annotations

from typing import Any

import psutil
import torch

from hicache.bench.checks import check_count, flag
from hicache.engine import CacheSpec
from hicache.engine.hybrid import default_state_slots, track_slots
from hicache.model import ModelConfig
from hicache.pools.host_layouts import check_ram, host_slots
from hicache.radix import CheckpointPolicy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QWEN3_NEXT_STATE_BYTES = 77_266_944
"""Qwen3-Next-80B-A3B's ``MambaStateParams.mamba_cache_per_req`` (36 GDN layers: conv 8192 x 3
bf16, state 32 x 128 x 128 fp32; README's pool table): ``--state-bytes``'s default."""
CHECKPOINT_FORMS = "finish, branch, every:N, or several joined by +, e.g. finish+branch"


def model_config(cfg: Any) -> ModelConfig:
    """The model of ``cfg``: its geometry, dtype, seed and ``--layers-pattern``."""
    return ModelConfig(
        vocab_size=cfg.vocab,
        num_layers=cfg.layers,
        num_heads=cfg.heads,
        num_kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate,
        attention=cfg.attention,
        dtype=DTYPES[cfg.dtype],
        seed=cfg.seed,
        layer_pattern=cfg.layers_pattern or "",
    )


def keeps_states(cfg: Any) -> bool:
    """Whether ``cfg``'s model has ``L`` layers (its cache keeps recurrent states)."""
    return bool(model_config(cfg).layers_of("L"))


def parse_checkpoint(text: Any) -> CheckpointPolicy:
    """The ``CheckpointPolicy`` of a ``--checkpoint`` value: ``finish`` (at each request's end),
    ``branch`` (where a prompt leaves the cached prefix), ``every:N`` (each multiple of
    ``N`` tokens, where the scheduler ends a prefill chunk), or several joined by ``+``;
    ``TypeError`` unless a str, ``ValueError`` naming the flag for anything else."""
    if not isinstance(text, str):
        raise TypeError(f"--checkpoint must be a str, got {type(text).__name__}")
    parts = text.split("+")
    every = [p.removeprefix("every:") for p in parts if p.startswith("every:")]
    known = {"finish", "branch"} | {f"every:{n}" for n in every}
    if set(parts) - known or len(set(parts)) < len(parts) or len(every) > 1:
        raise ValueError(f"--checkpoint must be {CHECKPOINT_FORMS}; got {text!r}")
    if every and not (every[0].isdigit() and int(every[0]) > 0):
        raise ValueError(f"--checkpoint every:N needs N a positive int of tokens; got {text!r}")
    return CheckpointPolicy(
        at_finish="finish" in parts,
        every_tokens=int(every[0]) if every else None,
        at_branch="branch" in parts,
    )


def spell_checkpoint(policy: CheckpointPolicy) -> str:
    """``policy`` as a ``--checkpoint`` value (``none`` when it takes no state)."""
    every = None if policy.every_tokens is None else f"every:{policy.every_tokens}"
    parts = [("finish", policy.at_finish), (every, every is not None), ("branch", policy.at_branch)]
    return "+".join(str(name) for name, on in parts if on) or "none"


def check_state_flags(cfg: Any) -> None:
    """``--state-bytes`` a positive int; ``--state-slots`` and ``--checkpoint`` only for a model
    with ``L`` layers, at least ``2 * max_requests`` slots and ``every:N`` a page multiple."""
    check_count("state_bytes", cfg.state_bytes, minimum=1)
    given = [name for name in ("state_slots", "checkpoint") if getattr(cfg, name) is not None]
    if given and not keeps_states(cfg):
        raise ValueError(
            f"{flag(given[0])} sets the recurrent states of a model with L layers: it needs "
            f"--layers-pattern with an L, got {cfg.layers_pattern or 'none (every layer F)'}"
        )
    if cfg.state_slots is not None:
        check_count("state_slots", cfg.state_slots, minimum=1)
        least = 2 * cfg.max_requests
        if cfg.state_slots < least:
            raise ValueError(
                f"--state-slots must be >= {least} (2 x (--max-running + 1): each request's own "
                f"state and the one it resumed from), got {cfg.state_slots}"
            )
    every = None if cfg.checkpoint is None else parse_checkpoint(cfg.checkpoint).every_tokens
    if every is not None and every % cfg.page_size:
        raise ValueError(
            f"--checkpoint every:{every} must be a multiple of --page-size ({cfg.page_size})"
        )


def state_settings(cfg: Any) -> dict[str, Any]:
    """``CacheSpec``'s ``state_slots`` and ``checkpoint`` from the flags (the spec's defaults
    for those not given)."""
    settings: dict[str, Any] = {"state_slots": cfg.state_slots}
    if cfg.checkpoint is not None:
        settings["checkpoint"] = parse_checkpoint(cfg.checkpoint)
    return settings


def state_plan(spec: CacheSpec) -> dict[str, Any]:
    """What a model with ``L`` layers runs with under ``spec``: its device ``state_slots``
    (the default resolved), the ``track_slots`` decode tracking adds, and its ``checkpoint``
    policy, spelled as the flag."""
    slots = default_state_slots(spec) if spec.state_slots is None else spec.state_slots
    checkpoint = spell_checkpoint(spec.checkpoint)
    return {"state_slots": slots, "track_slots": track_slots(spec), "checkpoint": checkpoint}


def check_memory(cfg: Any) -> None:
    """``ValueError`` when the device pool does not fit in free device memory (RAM on CPU)
    or the host pool does not fit in the RAM left."""
    per_token = model_config(cfg).kv_bytes_per_token  # all ranks' pools: MLA's are whole
    per_token *= cfg.tp if cfg.attention == "mla" else 1
    tokens = cfg.cache_spec("hiradix").device_tokens
    device_bytes = tokens * per_token
    host_bytes = host_slots(tokens, cfg.host_ratio, 0, cfg.page_size, per_token) * per_token
    host_bytes = 0 if cfg.hybrid else host_bytes  # a hybrid model runs device-only
    cuda = cfg.device.startswith("cuda")
    ram = psutil.virtual_memory().available
    free = torch.cuda.mem_get_info(cfg.device)[0] if cuda else ram
    if device_bytes > free:
        raise ValueError(
            f"--device-tokens {tokens}: the device pool needs "
            f"{device_bytes / 1e9:.1f} GB, {cfg.device} has {free / 1e9:.1f} GB"
        )
    check_ram(host_bytes if cuda else host_bytes + device_bytes)

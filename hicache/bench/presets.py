"""The ``hicache bench`` presets: the CPU and CUDA defaults of each setting, and SGLang's names
for them (``bench.config.BenchConfig`` validates what a run ends up with)."""

from __future__ import annotations

from typing import Any

# SGLang's multi-turn benchmark (benchmark/hicache/bench_multiturn.py) names its settings
# differently; ``hicache bench`` accepts those names for the same fields, so a run can be put
# next to theirs. Their clients have no shared system prompt: pass --system-len 0 to match.
SGLANG_MULTITURN = {
    "num_clients": "users",
    "num_rounds": "rounds",
    "request_length": "prompt_len",
    "output_length": "answer_len",
    "max_parallel": "max_running",
    "request_rate": "arrival_rate",
    "distribution": "arrival_distribution",
}

# The device pool holds a few conversations while the host pool (x host_ratio) holds them all:
# CPU: 24 conversations of up to 1.7k tokens (29k distinct) vs 8k device / 33k host slots;
# CUDA: 32 of up to 4.2k (72k distinct) vs 33k device / 131k host slots. Device-only LRU then
# thrashes between turns while the host tier keeps every conversation.
# One intra-op thread on CPU: on a small shared machine more threads spin against each other
# and can run many times slower.
CPU_DEFAULTS: dict[str, Any] = {
    "users": 24,
    "rounds": 6,
    "system_len": 512,
    "prompt_len": 192,
    "answer_len": 8,
    "layers": 8,
    "heads": 8,
    "kv_heads": 4,
    "head_dim": 32,
    "intermediate": 256,
    "vocab": 512,
    "dtype": "float32",
    "device_tokens": 8192,
    "max_running": 4,
    "max_prefill_tokens": 512,
    "threads": 1,
}
CUDA_DEFAULTS: dict[str, Any] = {  # Llama-3-8B attention geometry, light MLPs
    "users": 32,
    "rounds": 4,
    "system_len": 2048,
    "prompt_len": 512,
    "answer_len": 32,
    "layers": 32,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 1024,
    "vocab": 1024,
    "dtype": "bfloat16",
    "device_tokens": 32768,
    "max_running": 16,
    "max_prefill_tokens": 4096,
    "threads": None,
}

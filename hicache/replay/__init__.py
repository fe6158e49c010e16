"""``hicache replay``: request traces (Mooncake JSONL) through the real cache tiers."""

from hicache.replay.generate import GenerateSpec, generate_trace
from hicache.replay.ideal import ideal_hits
from hicache.replay.trace import (
    BLOCK_TOKENS,
    Trace,
    TraceError,
    TraceRequest,
    prompt_tokens,
    read_trace,
    write_trace,
)

__all__ = [
    "BLOCK_TOKENS",
    "GenerateSpec",
    "Trace",
    "TraceError",
    "TraceRequest",
    "generate_trace",
    "ideal_hits",
    "prompt_tokens",
    "read_trace",
    "write_trace",
]

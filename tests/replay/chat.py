"""The small generated chat trace the replay tests share: 6 sessions of 3 turns, one 512-token
system prompt, 512-token turns and answers."""

from __future__ import annotations

from typing import Any

from hicache.replay import GenerateSpec, Trace, generate_trace

B = 512
N, TURNS = 6, 3
FAST = {"h2d_gbps": 10.0, "d2h_gbps": 10.0}  # a clock that never waits on transfers


def chat_trace(**spec: Any) -> Trace:
    """The trace, with any ``GenerateSpec`` field overridden by ``spec``."""
    base: dict[str, Any] = dict(
        sessions=N,
        turns=TURNS,
        system_prompts=1,
        system_tokens=B,
        turn_tokens=B,
        output_tokens=B,
        session_rate=1.0,
        turn_gap_s=30.0,
    )
    return Trace(tuple(generate_trace(GenerateSpec(**{**base, **spec}))), B)

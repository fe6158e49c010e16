"""Synthetic Mooncake-format traces with controllable sharing.

Each session picks one of ``system_prompts`` system prompts (uniformly) and, when ``docs > 0``,
one of ``docs`` documents (Zipf-popular: document ``i`` with weight ``1 / (i + 1) ** zipf``),
then runs ``turns`` turns: turn ``r`` sends the system prompt, the document, every earlier turn
and answer, and ``turn_tokens`` new tokens, and asks for ``output_tokens``. Every piece of text
is a run of fresh token ids (never repeated elsewhere), and the hash ids are prefix hashes of
``block_tokens``-token blocks of that text, as in the Mooncake release: equal ids are equal
blocks after equal prefixes. Sessions start as a Poisson process of ``session_rate`` per
second (0: all at time 0); turn ``r`` arrives ``r * turn_gap_s`` after its session's start.
Everything is a pure function of the spec (``seed`` included). ``PRESETS`` name specs of a
shape worth replaying (``GenerateSpec.preset``).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from hicache.checks import check_int
from hicache.engine.config import check_real
from hicache.replay.trace import BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True)
class GenerateSpec:
    """What ``generate_trace`` builds (token counts per piece; see the module docstring)."""

    sessions: int = 64
    turns: int = 4
    system_prompts: int = 2
    system_tokens: int = 1024
    docs: int = 0
    doc_tokens: int = 2048
    zipf: float = 1.1
    turn_tokens: int = 256
    output_tokens: int = 64
    session_rate: float = 1.0
    turn_gap_s: float = 5.0
    block_tokens: int = BLOCK_TOKENS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sessions", "turns", "turn_tokens", "block_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("system_prompts", "system_tokens", "docs", "doc_tokens", "output_tokens"):
            check_int(name, getattr(self, name), minimum=0)
        check_int("seed", self.seed, minimum=0)
        for name in ("zipf", "session_rate", "turn_gap_s"):
            check_real(name, getattr(self, name))

    @classmethod
    def preset(cls, name: str, **changes: Any) -> GenerateSpec:
        """The spec ``PRESETS[name]``, with ``changes`` over it; ``ValueError`` for an unknown
        name."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **changes})


# The Mooncake conversation trace's shape (12,031 requests of 12,035 prompt tokens on average
# over 3,537 s): 3,000 conversations of 4 turns, each over a system prompt and one of 1,000
# Zipf-popular 8k-token documents: 12,000 requests of 10,880 to 13,184 prompt tokens (12,032 on
# average, 144 M in all) over about 53 minutes.
PRESETS: dict[str, dict[str, Any]] = {
    "long-prompt": {
        "sessions": 3000,
        "turns": 4,
        "system_prompts": 4,
        "system_tokens": 2048,
        "docs": 1000,
        "doc_tokens": 8192,
        "zipf": 1.1,
        "turn_tokens": 640,
        "output_tokens": 128,
        "session_rate": 1.0,
        "turn_gap_s": 60.0,
    },
}


class _Hasher:
    """Prefix hash ids: block ``i`` of a text gets one id per (id of block ``i - 1``, content)."""

    def __init__(self, block_tokens: int) -> None:
        self.block = block_tokens
        self.ids: dict[bytes, int] = {}

    def hash_ids(self, tokens: np.ndarray) -> tuple[int, ...]:
        out: list[int] = []
        for start in range(0, len(tokens), self.block):
            parent = out[-1].to_bytes(4, "little") if out else b""
            digest = hashlib.blake2b(
                parent + tokens[start : start + self.block].tobytes(), digest_size=16
            ).digest()
            out.append(self.ids.setdefault(digest, len(self.ids)))
        return tuple(out)


class _Fresh:
    """Runs of token ids never handed out before."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, n: int) -> np.ndarray:
        self.next += n
        return np.arange(self.next - n, self.next, dtype=np.int32)


def _picks(spec: GenerateSpec, rng: random.Random) -> tuple[list[int], list[int]]:
    """Each session's system prompt and document index (-1: none)."""
    none = [-1] * spec.sessions
    systems = [rng.randrange(spec.system_prompts) for _ in none] if spec.system_prompts else none
    weights = [1.0 / (i + 1) ** spec.zipf for i in range(spec.docs)]
    docs = rng.choices(range(spec.docs), weights, k=spec.sessions) if spec.docs else none
    return systems, docs


def _starts(spec: GenerateSpec, rng: random.Random) -> list[float]:
    if spec.session_rate == 0:
        return [0.0] * spec.sessions
    gaps = [rng.expovariate(spec.session_rate) for _ in range(spec.sessions - 1)]
    return [0.0, *itertools.accumulate(gaps)]


def generate_trace(spec: GenerateSpec) -> list[TraceRequest]:
    """The requests of ``spec``, in arrival order (ties: session, then turn order)."""
    rng = random.Random(spec.seed)
    text = _Fresh()
    system_texts = [text(spec.system_tokens) for _ in range(spec.system_prompts)]
    doc_texts = [text(spec.doc_tokens) for _ in range(spec.docs)]
    systems, docs = _picks(spec, rng)
    hasher = _Hasher(spec.block_tokens)
    out: list[TraceRequest] = []
    for s, start in enumerate(_starts(spec, rng)):
        history = [system_texts[systems[s]]] if systems[s] >= 0 else []
        history += [doc_texts[docs[s]]] if docs[s] >= 0 else []
        for turn in range(spec.turns):
            history.append(text(spec.turn_tokens))
            prompt = np.concatenate(history)
            ts = round((start + turn * spec.turn_gap_s) * 1e3, 3)
            ids = hasher.hash_ids(prompt)
            out.append(TraceRequest(ts, len(prompt), spec.output_tokens, ids))
            history.append(text(spec.output_tokens))
    out.sort(key=lambda r: r.timestamp_ms)
    return out

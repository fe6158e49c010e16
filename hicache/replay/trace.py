"""Mooncake-format request traces: read and validate JSONL, write it back.

One JSON object per line: ``timestamp`` (arrival, ms, a finite number >= 0), ``input_length``
(prompt tokens, an int >= 1), ``output_length`` (generated tokens, an int >= 0) and
``hash_ids`` (one int in ``[0, 2**31 - 1]`` per block of ``block_tokens`` prompt tokens, the
last block possibly partial: ``len(hash_ids) == ceil(input_length / block_tokens)``). The ids
are prefix hashes: equal ids are equal blocks with equal prefixes. Other keys are ignored;
blank lines are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_TOKENS = 512  # the Mooncake release's block size
HASH_MAX = 2**31 - 1  # hash ids become int32 token ids


class TraceError(ValueError):
    """A trace line that is not a valid request; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace (times in ms, lengths in tokens, one hash id per block)."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> str:
        ts = self.timestamp_ms
        return json.dumps(
            {
                "timestamp": int(ts) if float(ts).is_integer() else ts,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


@dataclass(frozen=True)
class Trace:
    """A validated trace: ``requests`` in arrival order (stable for equal timestamps),
    ``skipped`` bad lines (only under ``skip_bad``) and the first bad line's message."""

    requests: tuple[TraceRequest, ...]
    block_tokens: int
    skipped: int = 0
    first_error: str | None = None


def prompt_tokens(hash_ids: Iterable[int], input_length: int, block_tokens: int) -> np.ndarray:
    """The prompt of a request as token ids: block ``i`` is ``block_tokens`` copies of
    ``hash_ids[i]``, cut to ``input_length``. Equal hashes give equal runs, different hashes
    different runs, so the radix tree shares exactly the prefix blocks the trace shares.

    Returns a read-only int32 numpy array ``[input_length]`` (valid for
    ``RadixKey.from_validated``).
    """
    ids = np.fromiter(hash_ids, dtype=np.int32)
    tokens = np.repeat(ids, block_tokens)[:input_length]
    tokens.flags.writeable = False
    return tokens


def _int(obj: dict[str, Any], name: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name!r} must be an int, got {value!r:.40}")
    if value < minimum:
        raise ValueError(f"{name!r} must be >= {minimum}, got {value}")
    return value


def _timestamp(obj: dict[str, Any]) -> float:
    value = obj.get("timestamp")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'timestamp' must be a number (ms), got {value!r:.40}")
    try:
        ms = float(value)
    except OverflowError:  # an int past the float range
        ms = math.inf
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"'timestamp' must be a finite number >= 0, got {value!r:.40}")
    return ms


def _hash_ids(obj: dict[str, Any], input_length: int, block_tokens: int) -> tuple[int, ...]:
    ids = obj.get("hash_ids")
    if not isinstance(ids, list):
        raise ValueError(f"'hash_ids' must be a list of ints, got {ids!r:.40}")
    blocks = -(-input_length // block_tokens)
    if len(ids) != blocks:
        raise ValueError(
            f"'hash_ids' must have ceil(input_length / {block_tokens}) = {blocks} ids, "
            f"got {len(ids)}"
        )
    if any(type(h) is not int or not 0 <= h <= HASH_MAX for h in ids):
        bad = next(h for h in ids if type(h) is not int or not 0 <= h <= HASH_MAX)
        raise ValueError(f"'hash_ids' must be ints in [0, {HASH_MAX}], got {bad!r:.40}")
    return tuple(ids)


def parse_request(text: str | bytes, block_tokens: int = BLOCK_TOKENS) -> TraceRequest:
    """One trace line (``str``, or UTF-8 ``bytes``) as a request; ``ValueError`` saying what
    is wrong with it."""
    try:
        obj = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte {err.start}: {err.reason})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg})") from None
    except RecursionError:
        raise ValueError("not a trace request (JSON nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, got {type(obj).__name__}")
    length = _int(obj, "input_length", 1)
    return TraceRequest(
        timestamp_ms=_timestamp(obj),
        input_length=length,
        output_length=_int(obj, "output_length", 0),
        hash_ids=_hash_ids(obj, length, block_tokens),
    )


def read_trace(
    path: str | Path, *, block_tokens: int = BLOCK_TOKENS, skip_bad: bool = False
) -> Trace:
    """Read and validate every line of the JSONL file ``path``.

    A bad line raises ``TraceError`` naming ``path:line``; with ``skip_bad`` it is skipped and
    counted instead. ``ValueError`` for a file with no valid request; ``OSError`` when the file
    cannot be read.
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be a positive int, got {block_tokens!r}")
    requests: list[TraceRequest] = []
    skipped, first_error = 0, None
    with open(path, "rb") as f:  # each line decoded alone: bad UTF-8 is one bad line
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                requests.append(parse_request(text, block_tokens))
            except ValueError as err:
                message = f"{path}:{lineno}: {err}"
                if not skip_bad:
                    raise TraceError(message) from None
                skipped, first_error = skipped + 1, first_error or message
    if not requests:
        raise ValueError(f"{path}: no valid request in the trace")
    requests.sort(key=lambda r: r.timestamp_ms)
    return Trace(tuple(requests), block_tokens, skipped, first_error)


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> None:
    """Write ``requests`` as Mooncake JSONL, one per line."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(r.to_json() + "\n" for r in requests)

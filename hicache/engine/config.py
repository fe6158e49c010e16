"""Engine settings: one frozen, validated dataclass, and the number check the engine's configs
share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hicache.checks import check_int


def check_real(
    name: str, value: Any, *, minimum: float = 0.0, inclusive: bool = True, finite: bool = True
) -> float:
    """``value`` if a real number (int or float, not bool) ``>= minimum`` (``> minimum`` unless
    ``inclusive``): ``TypeError`` for a non-number, ``ValueError`` for NaN, for an infinity
    when ``finite``, or below the minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be a number, got nan")
    if finite and isinstance(value, float) and math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if value < minimum or (value == minimum and not inclusive):
        raise ValueError(f"{name} must be {'>=' if inclusive else '>'} {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches work.

    Attributes
    ----------
    max_running_requests : requests admitted at once (prefilling + decoding).
    max_prefill_tokens : prompt tokens computed per step; longer prompts are chunked.
    record_logits : keep every generated token's logits on its request (tests).
    stall_timeout_s : ``run`` raises ``RuntimeError`` after this long without progress
        (``math.inf``: never).
    """

    max_running_requests: int = 16
    max_prefill_tokens: int = 256
    record_logits: bool = False
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_int("max_running_requests", self.max_running_requests, minimum=1)
        check_int("max_prefill_tokens", self.max_prefill_tokens, minimum=1)
        if not isinstance(self.record_logits, bool):
            kind = type(self.record_logits).__name__
            raise TypeError(f"record_logits must be a bool, got {kind}")
        check_real("stall_timeout_s", self.stall_timeout_s, inclusive=False, finite=False)

"""Engine settings: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches work.

    Attributes
    ----------
    max_running_requests : requests admitted at once (prefilling + decoding).
    max_prefill_tokens : prompt tokens computed per step; longer prompts are chunked.
    record_logits : keep every generated token's logits on its request (tests).
    stall_timeout_s : ``run`` raises ``RuntimeError`` after this long without progress.
    """

    max_running_requests: int = 16
    max_prefill_tokens: int = 256
    record_logits: bool = False
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_prefill_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be positive, got {self.stall_timeout_s}")

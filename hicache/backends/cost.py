"""LoadCost: whether loading a prefix from storage beats recomputing it, from measurements.

Two running figures, each an exponentially weighted mean (weight ``alpha`` on the newest
sample): the **read time per page** of the storage tier (every read call of a prefetch: its
seconds over its pages, so per-call latency is spread over the batch as it really is) and the
**prefill time per token** of the model (``note_prefill`` after each forward pass that
computed prompt tokens). A load of ``p`` pages (``t`` tokens) is expected to take
``p * read_per_page`` and recomputing it ``t * prefill_per_token``; the load is worth it when
it is expected to be faster. Until both figures exist the answer is yes (load, and measure).

Recompute cost per token grows with context length (attention) and the model's own speed
varies per batch; the mean over recent forward passes is the estimate, which favours loading
long prefixes slightly less than it should (a conservative error: we recompute a little more).
"""

from __future__ import annotations

import threading

from hicache.checks import check_int

__all__ = ["LoadCost"]


class LoadCost:
    """The two running figures and the decision; safe to feed from several threads."""

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.read_per_page: float | None = None  # seconds
        self.prefill_per_token: float | None = None  # seconds
        self._lock = threading.Lock()

    def _mix(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.alpha * (sample - old)

    def note_read(self, pages: int, seconds: float) -> None:
        """A storage read of ``pages`` pages took ``seconds``."""
        if pages > 0 and seconds >= 0:
            with self._lock:
                self.read_per_page = self._mix(self.read_per_page, seconds / pages)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A forward pass computed ``tokens`` prompt tokens in ``seconds``."""
        if tokens > 0 and seconds > 0:
            with self._lock:
                self.prefill_per_token = self._mix(self.prefill_per_token, seconds / tokens)

    def worth_loading(self, pages: int, tokens: int) -> bool:
        """Whether loading ``pages`` pages (``tokens`` tokens) from storage is expected to be
        faster than recomputing them (True while either figure is unmeasured)."""
        check_int("pages", pages)
        check_int("tokens", tokens)
        read, prefill = self.read_per_page, self.prefill_per_token
        if read is None or prefill is None:
            return True
        return pages * read < tokens * prefill

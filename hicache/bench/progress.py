"""A plain progress bar on stderr (no dependencies)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``label |#####.....| done/total pct elapsed note``, redrawn in place with ``\\r``."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._draw("")

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        self._draw(note)

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, note: str) -> None:
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        pct = 100 * self.done // self.total
        line = f"{self.label:<12} |{bar}| {self.done}/{self.total} {pct:3d}% {elapsed:6.1f}s {note}"
        self.stream.write("\r" + line.ljust(99)[:99])
        self.stream.flush()

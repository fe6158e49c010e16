"""Progress on stderr: tqdm's bar on a terminal (the ``plot`` extra), plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class ProgressBar:
    """``label |#####.....| done/total pct elapsed note``.

    On a terminal with tqdm installed, tqdm draws the bar; on a terminal without it, the line
    is redrawn in place (``\\r``); otherwise (a log file, a captured pipe) a full line is
    written only at 0%, each 10% step and 100%.
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self._decile = -1
        self.start = time.perf_counter()
        tqdm = _tqdm() if self.tty else None
        self._bar = None if tqdm is None else tqdm(total=total, desc=label, file=self.stream)
        self._draw("")

    def update(self, n: int = 1, note: str = "") -> None:
        n = min(n, self.total - self.done)
        self.done += n
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
            return
        self._draw(note)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, note: str) -> None:
        decile = 10 * self.done // self.total
        if self._bar is not None or (not self.tty and decile == self._decile):
            return
        self._decile = decile
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        pct = 100 * self.done // self.total
        line = f"{self.label:<12} |{bar}| {self.done}/{self.total} {pct:3d}% {elapsed:6.1f}s {note}"
        self.stream.write("\r" + line.ljust(99)[:99] if self.tty else line.rstrip() + "\n")
        self.stream.flush()

"""Per-round line charts of the bench results, drawn on the dependency-free canvas."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from hicache.bench.png import Canvas, Color

PALETTE: list[Color] = [(220, 80, 40), (30, 110, 200), (40, 160, 70), (150, 60, 170)]
GRID: Color = (225, 225, 225)
INK: Color = (40, 40, 40)


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``value`` (at least 1)."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= value)


def _label(v: float) -> str:
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


def line_chart(
    canvas: Canvas,
    box: tuple[int, int, int, int],
    title: str,
    series: Mapping[str, Sequence[float]],
    x_label: str = "round",
) -> None:
    """Draw ``series`` (name -> y per x = 1..n) in ``box = (x0, y0, x1, y1)`` with axes,
    gridlines, tick labels and a title; NaN points are skipped."""
    x0, y0, x1, y1 = box
    left, top, right, bottom = x0 + 48, y0 + 26, x1 - 24, y1 - 30
    n = max(len(v) for v in series.values())
    y_max = _nice_max(max((v for s in series.values() for v in s if math.isfinite(v)), default=1))
    canvas.text(x0 + (x1 - x0 - Canvas.text_width(title, 2)) // 2, y0 + 4, title, INK, 2)
    for i in range(5):
        y = bottom - (bottom - top) * i // 4
        canvas.rect(left, y, right, y + 1, GRID)
        tick = _label(y_max * i / 4)
        canvas.text(left - 6 - Canvas.text_width(tick), y - 3, tick, INK)

    def px(i: int) -> float:
        return left + (right - left) * (i / (n - 1) if n > 1 else 0.5)

    for i in range(n):
        canvas.text(int(px(i)) - 2, bottom + 6, str(i + 1), INK)
    canvas.text((left + right - Canvas.text_width(x_label)) // 2, bottom + 18, x_label, INK)
    canvas.rect(left, top, left + 1, bottom + 1, INK)
    canvas.rect(left, bottom, right, bottom + 1, INK)
    for color, ys in zip(PALETTE, series.values(), strict=False):
        pts = [
            (px(i), bottom - (bottom - top) * v / y_max)
            for i, v in enumerate(ys)
            if math.isfinite(v)
        ]
        for (ax, ay), (bx, by) in zip(pts, pts[1:], strict=False):
            canvas.line(ax, ay, bx, by, color, thick=2)
        for cx, cy in pts:
            canvas.rect(int(cx) - 3, int(cy) - 3, int(cx) + 4, int(cy) + 4, color)


def legend(canvas: Canvas, x: int, y: int, names: Sequence[str]) -> None:
    for i, (name, color) in enumerate(zip(names, PALETTE, strict=False)):
        ox = x + i * 220
        canvas.rect(ox, y, ox + 24, y + 4, color)
        canvas.text(ox + 30, y - 5, name, INK, 2)


def plot_rounds(path: str | Path, rounds: dict[str, list[dict[str, float]]]) -> None:
    """Two panels — hit rate (%) and TTFT p50 (ms) per round — one line per mode; saved as PNG."""
    canvas = Canvas(1000, 420)
    names = list(rounds)
    hit = {m: [r["hit_rate"] for r in rounds[m]] for m in names}
    ttft = {m: [r["ttft_p50_ms"] for r in rounds[m]] for m in names}
    line_chart(canvas, (0, 10, 500, 380), "hit rate (%)", hit)
    line_chart(canvas, (500, 10, 1000, 380), "TTFT p50 (ms)", ttft)
    legend(canvas, 260, 400, names)
    canvas.save(path)

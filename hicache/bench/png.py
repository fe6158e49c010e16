"""A dependency-free RGB canvas and PNG writer (zlib + struct), enough for simple line charts."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from hicache.bench.font import GLYPH_HEIGHT, GLYPH_WIDTH, glyph

Color = tuple[int, int, int]


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of an ``[H, W, 3]`` uint8 RGB image (8-bit truecolour, no filtering)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"pixels must be uint8 [H, W, 3], got {pixels.dtype} {pixels.shape}")
    h, w, _ = pixels.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), pixels.reshape(h, w * 3)], axis=1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


class Canvas:
    """A white ``width x height`` RGB image with lines, rectangles and 5x7 bitmap text."""

    def __init__(self, width: int, height: int) -> None:
        self.pixels = np.full((height, width, 3), 255, dtype=np.uint8)

    @property
    def size(self) -> tuple[int, int]:
        return self.pixels.shape[1], self.pixels.shape[0]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill ``[x0, x1) x [y0, y1)``, clipped to the canvas."""
        w, h = self.size
        self.pixels[max(y0, 0) : min(y1, h), max(x0, 0) : min(x1, w)] = color

    def line(
        self, x0: float, y0: float, x1: float, y1: float, color: Color, thick: int = 1
    ) -> None:
        """A straight line, ``thick`` pixels wide, sampled once per pixel step."""
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for t in np.linspace(0.0, 1.0, steps):
            x, y = round(x0 + t * (x1 - x0)), round(y0 + t * (y1 - y0))
            r = thick // 2
            self.rect(x - r, y - r, x - r + thick, y - r + thick, color)

    def text(self, x: int, y: int, s: str, color: Color = (0, 0, 0), scale: int = 1) -> None:
        """Draw ``s`` (upper-cased) with its top-left corner at ``(x, y)``."""
        for i, ch in enumerate(s.upper()):
            bits = glyph(ch)
            ox = x + i * (GLYPH_WIDTH + 1) * scale
            for row in range(GLYPH_HEIGHT):
                for col in range(GLYPH_WIDTH):
                    if bits[row] >> (GLYPH_WIDTH - 1 - col) & 1:
                        px, py = ox + col * scale, y + row * scale
                        self.rect(px, py, px + scale, py + scale, color)

    @staticmethod
    def text_width(s: str, scale: int = 1) -> int:
        return len(s) * (GLYPH_WIDTH + 1) * scale

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(encode_png(self.pixels))

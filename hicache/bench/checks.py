"""Checks of ``hicache bench``'s settings, each naming its command-line flag."""

from __future__ import annotations

from typing import Any

import torch


def check_count(name: str, value: Any, minimum: int) -> None:
    """``TypeError`` unless an int (not bool), ``ValueError`` below ``minimum`` (0 or 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{flag(name)} must be an int, got {type(value).__name__}")
    if value < minimum:
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{flag(name)} must be {bound}, got {value}")


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def check_device(device: str) -> None:
    """``ValueError`` unless ``device`` is ``cpu`` or an existing ``cuda[:N]``."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")

"""Checks of ``hicache bench``'s settings, each naming its command-line flag."""

from __future__ import annotations

from typing import Any

import torch

from hicache.model.config import LAYER_KINDS


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


def check_layers_pattern(pattern: Any, layers: int) -> None:
    """``TypeError`` unless ``--layers-pattern`` is a str (or None: unset), ``ValueError`` when
    it is empty, has a letter other than ``F``/``S``/``L`` or not ``layers`` letters."""
    if pattern is None:
        return
    if not isinstance(pattern, str):
        raise TypeError(f"--layers-pattern must be a str, got {type(pattern).__name__}")
    if not pattern or set(pattern) - set(LAYER_KINDS):
        raise ValueError(
            f"--layers-pattern must be one or more of the letters {', '.join(LAYER_KINDS)} "
            f"(full attention, sliding window, linear recurrent), e.g. FSLFSL; got {pattern!r}"
        )
    if len(pattern) != layers:
        raise ValueError(
            f"--layers-pattern {pattern} has {len(pattern)} letters, one per layer, but "
            f"--layers is {layers}: leave --layers out (the pattern sets it) or make them agree"
        )

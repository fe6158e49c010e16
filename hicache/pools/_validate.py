"""Argument checks shared by the pools (public input -> TypeError/ValueError naming it)."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if an int ``>= minimum``: ``TypeError`` for a non-int, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value

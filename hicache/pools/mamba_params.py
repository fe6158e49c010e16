"""MambaStateParams: the per-request recurrent state of a model's linear-attention layers.

Shaped like SGLang's ``Mamba2CacheParams``: ``.layers``, ``.shape.conv`` / ``.shape.temporal``,
``.dtype.conv`` / ``.dtype.temporal`` and ``mamba_cache_per_req``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from hicache.checks import check_int

Shape = tuple[int, ...]


class MambaStateShape(NamedTuple):
    """Per-layer, per-request state shapes: ``conv`` one shape per conv tensor (e.g.
    ``(dim, kernel - 1)``), ``temporal`` the SSM state ``(heads, head_dim, state_size)``."""

    conv: tuple[Shape, ...]
    temporal: Shape


class MambaStateDType(NamedTuple):
    """dtypes of the conv tensors and of the temporal (SSM) state."""

    conv: torch.dtype
    temporal: torch.dtype


@dataclass(frozen=True, kw_only=True)
class MambaStateParams:
    """What one request's recurrent state is, over all of the model's linear-attention layers.

    Parameters
    ----------
    layers : model layer ids of the linear-attention layers (distinct ints >= 0, at least one),
        in pool order: pool layer ``i`` is model layer ``layers[i]``. Sequences are stored as
        tuples (``layers``, ``conv``, ``temporal``), so the params are immutable and hashable.
    conv : shape of each conv state tensor of one layer and request, e.g. ``[(dim, kernel-1)]``
        (at least one; positive ints).
    temporal : ``(heads, head_dim, state_size)`` of the SSM state (positive ints).
    conv_dtype, temporal_dtype : floating torch dtypes.
    """

    layers: Sequence[int]
    conv: Sequence[Sequence[int]]
    temporal: Sequence[int]
    conv_dtype: torch.dtype = torch.bfloat16
    temporal_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _layer_ids(self.layers))
        if not isinstance(self.conv, Sequence) or len(self.conv) == 0:
            raise ValueError(f"conv must be a non-empty list of shapes, got {self.conv!r}")
        conv = tuple(_shape(f"conv[{i}]", s) for i, s in enumerate(self.conv))
        object.__setattr__(self, "conv", conv)
        temporal = _shape("temporal", self.temporal)
        if len(temporal) != 3:
            raise ValueError(f"temporal must be (heads, head_dim, state_size), got {temporal}")
        object.__setattr__(self, "temporal", temporal)
        for name in ("conv_dtype", "temporal_dtype"):
            value = getattr(self, name)
            if not isinstance(value, torch.dtype) or not value.is_floating_point:
                raise TypeError(f"{name} must be a floating torch.dtype, got {value!r}")

    @property
    def shape(self) -> MambaStateShape:
        return MambaStateShape(tuple(tuple(s) for s in self.conv), tuple(self.temporal))

    @property
    def dtype(self) -> MambaStateDType:
        return MambaStateDType(self.conv_dtype, self.temporal_dtype)

    @property
    def conv_bytes_per_layer(self) -> list[int]:
        """Bytes of each conv tensor of one request in one layer."""
        return [math.prod(s) * self.conv_dtype.itemsize for s in self.conv]

    @property
    def temporal_bytes_per_layer(self) -> int:
        """Bytes of the temporal state of one request in one layer."""
        return math.prod(self.temporal) * self.temporal_dtype.itemsize

    @property
    def mamba_cache_per_req(self) -> int:
        """Bytes one request's state takes over all layers (conv tensors and temporal)."""
        per_layer = sum(self.conv_bytes_per_layer) + self.temporal_bytes_per_layer
        return per_layer * len(self.layers)


def _layer_ids(layers: Any) -> tuple[int, ...]:
    if not isinstance(layers, Sequence) or isinstance(layers, (str, bytes)) or not layers:
        raise ValueError(f"layers must be a non-empty list of layer ids, got {layers!r}")
    ids = tuple(check_int(f"layers[{i}]", v) for i, v in enumerate(layers))
    if len(set(ids)) != len(ids):
        raise ValueError(f"layers must be distinct, got {list(ids)}")
    return ids


def _shape(name: str, shape: Any) -> Shape:
    if not isinstance(shape, Sequence) or isinstance(shape, (str, bytes)) or not shape:
        raise ValueError(f"{name} must be a non-empty tuple of ints, got {shape!r}")
    return tuple(check_int(f"{name}[{i}]", v, minimum=1) for i, v in enumerate(shape))

"""The state tensors of a Mamba pool (``MambaPool.State``, ``MambaPool.SpeculativeState``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True, kw_only=True)
class MambaState:
    """A pool's recurrent state, or one layer of it (:meth:`at_layer_idx`).

    Attributes
    ----------
    conv : one tensor per conv shape, ``[num_layers, size + 1, *conv_shape]`` (one layer:
        ``[size + 1, *conv_shape]``), ``conv_dtype``, on the pool's device.
    temporal : ``[num_layers, size + 1, heads, head_dim, state_size]`` (one layer: without the
        first dim), ``temporal_dtype``.
    """

    conv: list[torch.Tensor]
    temporal: torch.Tensor

    def at_layer_idx(self, layer: int) -> MambaState:
        """The same state of pool layer ``layer`` (views, no copy), of the same class."""
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kwargs[field.name] = (
                [t[layer] for t in value] if isinstance(value, list) else value[layer]
            )
        return type(self)(**kwargs)

    def mem_usage_bytes(self) -> int:
        """Bytes of every tensor of this state."""
        return sum(t.nbytes for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor, fields in order, lists flattened."""
        out: list[torch.Tensor] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out.extend(value if isinstance(value, list) else [value])
        return out


@dataclass(frozen=True, kw_only=True)
class MambaSpeculativeState(MambaState):
    """A state with the per-draft-token buffers of speculative verification.

    Attributes
    ----------
    intermediate_ssm : ``[num_layers, spec_state_size + 1, draft_tokens, heads, head_dim,
        state_size]``, ``temporal_dtype``: the SSM state after each draft token.
    intermediate_conv_window : per conv shape, ``[num_layers, spec_state_size + 1,
        draft_tokens, *conv_shape]``, ``conv_dtype``: the conv window after each draft token.
    """

    intermediate_ssm: torch.Tensor
    intermediate_conv_window: list[torch.Tensor]


class StateTensorInfo(NamedTuple):
    """One state tensor as a transfer op sees it: ``layers x rows x row_bytes``.

    ``name`` is ``"conv0"``, ``"conv1"``, ... or ``"temporal"``; ``tensor`` is
    ``[num_layers, size + 1, ...]`` and contiguous, so row ``r`` of layer ``l`` is the
    ``row_bytes`` bytes at ``tensor.data_ptr() + (l * (size + 1) + r) * row_bytes``.
    """

    name: str
    tensor: torch.Tensor
    row_bytes: int

"""Shared pieces of the Mamba pool tests: small params, requests, a recording counter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.pools import MambaStateParams


def params(
    conv_dtype: torch.dtype = torch.bfloat16, temporal_dtype: torch.dtype = torch.float32
) -> MambaStateParams:
    """Two layers (model ids 1 and 3), two conv tensors, a small SSM state."""
    return MambaStateParams(
        layers=[1, 3],
        conv=[(6, 3), (4, 3)],
        temporal=(2, 3, 5),
        conv_dtype=conv_dtype,
        temporal_dtype=temporal_dtype,
    )


@dataclass
class FakeReq:
    """The attributes of SGLang's ``Req`` that the hybrid pool reads and writes."""

    req_pool_idx: int | None = None
    mamba_pool_idx: torch.Tensor | None = None
    mamba_ping_pong_track_buffer: torch.Tensor | None = None
    mamba_next_track_idx: int | None = None


class RecordingCounter:
    def __init__(self) -> None:
        self.waited: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waited.append(layer_id)


def slot_ids(req: FakeReq) -> list[int]:
    """Every slot ``req`` holds (state first, then track slots)."""
    out = [] if req.mamba_pool_idx is None else [int(req.mamba_pool_idx)]
    track = req.mamba_ping_pong_track_buffer
    return out + ([] if track is None else track.tolist())

"""One forward pass's batch: packed new tokens plus each request's attention plan, built once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
import torch.nn.functional as F

from hicache.devices import canonical_device, to_device

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_HAS_GQA = _TORCH >= (2, 5)  # scaled_dot_product_attention(enable_gqa=...)

KVGather = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Segment:
    """One request in the batch: packed queries ``[start, end)`` over context ``kv_slots``.

    ``kv_slots``: ``[S]`` int64 slots of the request's whole context (prefix + new tokens).
    ``mask``: ``[end - start, S]`` bool, key ``j`` visible to a query at position ``p`` iff
    ``j <= p``; None for a single query at the end of its context (decode sees everything) and
    for new tokens with no prefix, where ``causal`` says the same (the fused kernels then skip
    the masked half).
    """

    start: int
    end: int
    kv_slots: torch.Tensor
    mask: torch.Tensor | None
    causal: bool = False


@dataclass(frozen=True)
class ForwardBatch:
    """The new tokens of ``B`` requests, packed, and how each attends to its whole context.

    Request ``b`` already has ``prefix_lens[b]`` tokens of KV in the pool; this pass adds
    ``len(input_ids[b])`` tokens (a prefill chunk, or 1 token for decode) at positions
    ``prefix_lens[b] ..``. Its row ``req_to_token[req_pool_indices[b]]`` must already name the
    new tokens' slots (``out_cache_loc``) before the forward runs.

    Attributes
    ----------
    input_ids, positions, out_cache_loc : ``[T]`` int64 on the model device.
    segments : one :class:`Segment` per request, in batch order.
    last_index : ``[B]`` int64, the packed index of each request's last new token.
    req_pool_indices : each request's ``req_to_token`` row (host ints; linear layers map them
        to state slots).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    segments: tuple[Segment, ...]
    last_index: torch.Tensor
    req_pool_indices: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        req_to_token: torch.Tensor,
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        input_ids: Sequence[Sequence[int]],
        out_cache_loc: torch.Tensor,
        device: torch.device | str,
    ) -> ForwardBatch:
        """Plan a batch. ``req_to_token``: the ``[rows, max_context_len]`` int32 table;
        ``out_cache_loc``: ``[T]`` int64 slots of the new tokens (any device)."""
        if not (len(req_pool_indices) == len(prefix_lens) == len(input_ids)) or not input_ids:
            raise ValueError("req_pool_indices, prefix_lens and input_ids must be equal, non-empty")
        ext = np.fromiter(map(len, input_ids), dtype=np.int64, count=len(input_ids))
        if ext.min() <= 0:
            raise ValueError("every request needs at least one new token")
        prefix = np.asarray(prefix_lens, dtype=np.int64)
        ends = np.cumsum(ext)
        on = canonical_device(device)  # CPU-built tensors go over non-blocking (no sync)
        # one copy of every row's context: each segment's slots are a view of it
        kv = _table_rows(req_to_token, req_pool_indices, int((prefix + ext).max()), on)
        spans = zip(prefix.tolist(), ext.tolist(), ends.tolist(), strict=True)
        segments = tuple(_segment(kv[b], p, n, e, on) for b, (p, n, e) in enumerate(spans))
        positions = np.arange(int(ends[-1])) + np.repeat(prefix - (ends - ext), ext)
        return cls(
            input_ids=to_device(torch.tensor(list(chain.from_iterable(input_ids))), on),
            positions=to_device(torch.from_numpy(positions), on),
            out_cache_loc=out_cache_loc.to(device=on, dtype=torch.int64),
            segments=segments,
            last_index=to_device(torch.from_numpy(ends - 1), on),
            req_pool_indices=tuple(req_pool_indices),
        )

    def attend(self, q: torch.Tensor, gather: KVGather, scale: float) -> torch.Tensor:
        """Causal attention of the packed queries over each request's context:
        :func:`attend` over :attr:`segments`."""
        return attend(self.segments, q, gather, scale)


def attend(
    segments: Sequence[Segment], q: torch.Tensor, gather: KVGather, scale: float
) -> torch.Tensor:
    """Attention of each segment's packed queries over its ``kv_slots``, as its mask says.

    Parameters
    ----------
    q : ``[T, H, D]`` packed queries.
    gather : maps ``[S]`` context slots to keys ``[S, KVH, D]`` and values ``[S, KVH, Dv]``
        (``H % KVH == 0``: grouped-query attention).

    Returns
    -------
    ``[T, H, Dv]`` in ``q``'s dtype, on ``q``'s device.
    """
    outs = []
    for seg in segments:
        k, v = gather(seg.kv_slots)
        outs.append(_sdpa(q[seg.start : seg.end], k, v, seg.mask, scale, seg.causal))
    return torch.cat(outs)


def _table_rows(
    table: torch.Tensor, rows: Sequence[int], width: int, device: torch.device | str
) -> torch.Tensor:
    """``table[rows, :width]`` as int64 on ``device``: ``[len(rows), width]``, one copy."""
    if len(rows) == 1:
        return table[rows[0], None, :width].to(device, torch.int64)
    return table[to_device(torch.tensor(rows), table.device), :width].to(device, torch.int64)


def _segment(
    kv: torch.Tensor, prefix: int, n: int, end: int, device: torch.device | str
) -> Segment:
    """The segment of packed tokens ``[end - n, end)``; ``kv``: the row's context slots."""
    seq = prefix + n
    mask = None
    if n > 1 and prefix:  # built where it is used (a 32k-token prompt's would be 1 GiB)
        keys, queries = torch.arange(seq, device=device), torch.arange(prefix, seq, device=device)
        mask = keys[None, :] <= queries[:, None]
    return Segment(end - n, end, kv[:seq], mask, causal=n > 1 and not prefix)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """``q [n, H, D]``, ``k [S, KVH, D]``, ``v [S, KVH, Dv]`` -> ``[n, H, Dv]``.

    Called with 4-D ``[1, heads, len, dim]`` operands: the fused (flash / memory-efficient)
    backends take only 4-D input, 3-D input falls back to the slow math backend. On CUDA a
    masked (prefill) call expands the KV heads rather than passing ``enable_gqa``: with a mask
    torch serves ``enable_gqa`` only with the math backend, whose fp32 ``[H, n, S]`` scores
    take 128 GiB at 32k tokens; the memory-efficient kernel takes the expanded heads.
    """
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    if group > 1 and (not _HAS_GQA or (mask is not None and q.is_cuda)):
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    extra = {"enable_gqa": True} if k.shape[1] < q.shape[1] else {}
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, **extra
    )
    return out[0].transpose(0, 1)

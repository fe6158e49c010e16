"""RadixKey: the token ids of a prefix plus the namespace (``extra_key``) they live in.

Token ids are held as one read-only, contiguous int32 numpy array (token ids are vocabulary
indices, far below 2**31), validated once when the key is built. The tree compares pages of these
arrays with vectorised numpy, so building a key from a Python list (about 15 ns per token) is the
only per-token Python cost, paid once per request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

TOKEN_DTYPE = np.int32
_TOKEN_MAX = int(np.iinfo(TOKEN_DTYPE).max)


def _from_numpy(ids: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {ids.shape}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high > _TOKEN_MAX:
        raise ValueError(f"token_ids must be in [0, {_TOKEN_MAX}], got values in [{low}, {high}]")
    return np.array(ids, dtype=TOKEN_DTYPE)  # always a private copy


def as_token_array(token_ids: Any) -> np.ndarray:
    """Validate ``token_ids`` and return a private read-only 1-D int32 copy.

    Accepts a sequence of ints, an integer numpy array or an integer torch tensor (any device).
    Raises ``TypeError`` for non-integer ids (floats, bools, strings, objects) and ``ValueError``
    for negative ids or a non-1-D input.
    """
    if isinstance(token_ids, RadixKey):
        return token_ids.token_ids
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex:
            raise TypeError(f"token_ids must be integers, got dtype {token_ids.dtype}")
        if token_ids.dtype == torch.bool:
            raise TypeError("token_ids must be integers, got dtype torch.bool")
        token_ids = token_ids.detach().cpu().numpy()
    elif isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (Sequence, np.ndarray)):
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    arr = _from_numpy(np.asarray(token_ids))
    arr.flags.writeable = False
    return arr


def edge_ids(ids: np.ndarray) -> np.ndarray:
    """A slice of a RadixKey's (read-only) ids as a node may keep it: the slice itself when it
    covers at least half of the buffer it views, else a copy. A node thus pins at most twice its
    own key bytes, and the common insert (a new tail making up most of the request) copies
    nothing.
    """
    base = ids.base
    if isinstance(base, np.ndarray) and 2 * ids.nbytes >= base.nbytes:
        return ids
    return ids.copy()


BYTES_COMPARE_MAX = 4096  # tokens; above this a bytes copy costs more than numpy's compare


def common_prefix_len(
    a: np.ndarray, b: np.ndarray, page_size: int, scratch: np.ndarray | None = None
) -> int:
    """Length of the common prefix of ``a`` and ``b`` rounded down to whole pages.

    Both lengths must be page multiples. Short equal runs (the common case) are settled by one
    bytes comparison; otherwise one vectorised comparison, written into ``scratch`` (a bool
    buffer at least as long, reused so long keys allocate nothing). No per-token loop.
    """
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if n <= BYTES_COMPARE_MAX and a.tobytes() == b.tobytes():
        return n
    out = scratch[:n] if scratch is not None and len(scratch) >= n else None
    ne = np.not_equal(a, b, out=out)
    first = int(ne.argmax())
    if not ne[first]:
        return n
    return first - first % page_size


class RadixKey:
    """Token ids of a prefix and the namespace they are cached in.

    Parameters
    ----------
    token_ids : sequence of non-negative ints, integer numpy array or integer tensor; copied into
        a read-only int32 numpy array ``[len]`` on the CPU.
    extra_key : hashable namespace (LoRA id, tenant salt) or None. Keys with different
        ``extra_key`` never share a tree node, not even their first page.

    Slicing (``key[a:b]``) returns a RadixKey viewing the same ids in the same namespace.
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Any, extra_key: Hashable | None = None) -> None:
        try:
            hash(extra_key)
        except TypeError:
            raise TypeError(
                f"extra_key must be hashable, got {type(extra_key).__name__}"
            ) from None
        self.token_ids: np.ndarray = as_token_array(token_ids)
        self.extra_key = extra_key

    @classmethod
    def _trusted(cls, token_ids: np.ndarray, extra_key: Hashable | None) -> RadixKey:
        """A key over an already validated read-only int32 array (no copy, no checks)."""
        key = cls.__new__(cls)
        key.token_ids, key.extra_key = token_ids, extra_key
        return key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, item: slice) -> RadixKey:
        if not isinstance(item, slice):
            raise TypeError(f"RadixKey supports slicing only, got {type(item).__name__}")
        return RadixKey._trusted(self.token_ids[item], self.extra_key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return self.extra_key == other.extra_key and np.array_equal(
            self.token_ids, other.token_ids
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-equality semantics: not a dict key

    def __repr__(self) -> str:
        ids = self.token_ids
        shown = ids[:8].tolist()
        more = f", ... ({len(ids)} tokens)" if len(ids) > 8 else ""
        return f"RadixKey({shown}{more}, extra_key={self.extra_key!r})"


def as_radix_key(key: Any) -> RadixKey:
    """``key`` itself if it is a RadixKey, else ``RadixKey(key)`` (namespace None)."""
    return key if isinstance(key, RadixKey) else RadixKey(key)

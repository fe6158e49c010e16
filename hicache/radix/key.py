"""RadixKey: the token ids of a prefix plus the namespace (``extra_key``) they live in.

Token ids are held as one read-only, contiguous int32 numpy array (token ids are vocabulary
indices, far below 2**31), validated once when the key is built. The tree compares pages of these
arrays with vectorised numpy, so building a key from a Python list (one C-level pass through
``array.array``) is the only per-token Python cost, paid once per request.

Nothing is converted silently: bools, floats (even integral ones), strings, objects and nested
sequences raise ``TypeError``; negative or too large ids and arrays that are not 1-D raise
``ValueError``.
"""

from __future__ import annotations

import array
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

TOKEN_DTYPE = np.int32
_TOKEN_MAX = int(np.iinfo(TOKEN_DTYPE).max)
_RANGE = f"token_ids must be in [0, {_TOKEN_MAX}]"
_INT32_CODE = "i"  # array.array's C int: 4 bytes on every platform numpy and torch support
assert array.array(_INT32_CODE).itemsize == np.dtype(TOKEN_DTYPE).itemsize
# Sequences whose items are not token ids (array.array would read bytes-likes as raw bytes).
_NOT_ID_SEQUENCES = (str, bytes, bytearray, memoryview)
# Namespace atoms: exact built-in types, whose equality and hash are by value and never mix
# (bool, float and subclasses such as enums or numpy scalars may equal an int of another meaning).
_EXTRA_KEY_ATOMS = (str, bytes, int, type(None))
_EXTRA_KEY_RULE = (
    "extra_key must be hashable: None, a str, bytes, an int (not bool) or a tuple of those"
)


def check_extra_key(extra_key: Any) -> Hashable | None:
    """``extra_key`` itself if it is a valid namespace, else ``TypeError`` naming ``extra_key``.

    Valid: None, ``str``, ``bytes``, ``int`` (not ``bool``) and tuples of valid namespaces
    (nested to any depth), all of exactly these built-in types. ``1``, ``"1"``, ``b"1"`` and
    ``(1,)`` are four namespaces; equal values are one namespace. O(1) for an atom, O(items)
    for a tuple.
    """
    if type(extra_key) in _EXTRA_KEY_ATOMS:
        return extra_key
    stack = [extra_key]
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            stack.extend(item)
        elif type(item) not in _EXTRA_KEY_ATOMS:
            raise TypeError(f"{_EXTRA_KEY_RULE}; got {type(item).__name__} {item!r:.60}")
    return extra_key


def _from_numpy(ids: np.ndarray) -> np.ndarray:
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {ids.shape}")
    if ids.size == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high > _TOKEN_MAX:
        raise ValueError(f"{_RANGE}, got values in [{low}, {high}]")
    return np.array(ids, dtype=TOKEN_DTYPE)  # always a private copy


def _from_tensor(ids: torch.Tensor) -> np.ndarray:
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"token_ids must be integers, got dtype {ids.dtype}")
    return _from_numpy(ids.detach().cpu().numpy())


def _from_sequence(ids: Sequence[Any]) -> np.ndarray:
    """One C-level pass (``array.array``) that takes ints and integer scalars (``__index__``)
    and refuses floats, strings, None and nested sequences; then vectorised range checks."""
    try:
        arr = np.frombuffer(array.array(_INT32_CODE, ids), dtype=TOKEN_DTYPE)
    except TypeError as exc:
        raise TypeError(f"token_ids must be a sequence of ints: {exc}") from None
    except OverflowError:
        raise ValueError(f"{_RANGE}, got a value outside int32") from None
    if len(arr):
        low = int(arr.min())
        if low < 0:
            raise ValueError(f"{_RANGE}, got {low}")
        if low <= 1:
            _reject_bools(ids, arr)
    return arr


def _reject_bools(ids: Sequence[Any], arr: np.ndarray) -> None:
    """``TypeError`` if an item of ``ids`` is a bool. A bool became 0 or 1 in ``arr``, so only
    those positions are looked at (usually a handful per request), or every item in one C-level
    pass when they are many (an eighth or more)."""
    small = arr <= 1
    count = int(np.count_nonzero(small))
    items = ids if count * 8 >= len(arr) else map(ids.__getitem__, np.flatnonzero(small).tolist())
    if bool in set(map(type, items)):
        raise TypeError(
            "token_ids must be a sequence of ints, got a bool (True/False are not token ids)"
        )


def as_token_array(token_ids: Any) -> np.ndarray:
    """Validate ``token_ids`` and return a private read-only 1-D int32 copy.

    Accepts a sequence of ints (or integer scalars), an integer numpy array or an integer torch
    tensor (any device; a CUDA tensor is copied to the CPU). Raises ``TypeError`` for non-integer
    ids (bools, floats even when integral, strings, None, objects, nested sequences) and
    ``ValueError`` for ids outside ``[0, 2**31 - 1]`` or an array that is not 1-D (also when
    it is empty, e.g. shape ``(0, 3)``).
    """
    if isinstance(token_ids, RadixKey):
        return token_ids.token_ids
    if isinstance(token_ids, torch.Tensor):
        arr = _from_tensor(token_ids)
    elif isinstance(token_ids, np.ndarray):
        arr = _from_numpy(token_ids)
    elif isinstance(token_ids, Sequence) and not isinstance(token_ids, _NOT_ID_SEQUENCES):
        arr = _from_sequence(token_ids)
    else:
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
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
    extra_key : namespace (LoRA id, tenant salt) or None: None, ``str``, ``bytes``, ``int``
        (not ``bool``) or a tuple of these, nested to any depth, all of exactly these built-in
        types; anything else (float, bool, enums, numpy scalars, lists) raises ``TypeError``
        (``check_extra_key``). Namespaces are equal when their values are equal: ``1``,
        ``"1"``, ``b"1"`` and ``(1,)`` are four namespaces. Keys with different ``extra_key``
        never share a tree node, not even their first page.

    Slicing (``key[a:b]``) returns a RadixKey viewing the same ids in the same namespace.
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Any, extra_key: Hashable | None = None) -> None:
        self.extra_key = check_extra_key(extra_key)
        self.token_ids: np.ndarray = as_token_array(token_ids)

    @classmethod
    def from_validated(cls, token_ids: np.ndarray, extra_key: Hashable | None) -> RadixKey:
        """A key over an already validated read-only int32 array (no copy). Only the namespace
        is checked (``check_extra_key``, O(1) for an atom): callers such as ``kv_key`` pass a
        request's ``extra_key`` here unvalidated."""
        key = cls.__new__(cls)
        key.token_ids, key.extra_key = token_ids, check_extra_key(extra_key)
        return key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, item: slice) -> RadixKey:
        if not isinstance(item, slice):
            raise TypeError(f"RadixKey supports slicing only, got {type(item).__name__}")
        return RadixKey.from_validated(self.token_ids[item], self.extra_key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return self.extra_key == other.extra_key and np.array_equal(self.token_ids, other.token_ids)

    __hash__ = None  # type: ignore[assignment]  # mutable-equality semantics: not a dict key

    def __repr__(self) -> str:
        ids = self.token_ids
        shown = ids[:8].tolist()
        more = f", ... ({len(ids)} tokens)" if len(ids) > 8 else ""
        return f"RadixKey({shown}{more}, extra_key={self.extra_key!r})"


def as_radix_key(key: Any) -> RadixKey:
    """``key`` itself if it is a RadixKey, else ``RadixKey(key)`` (namespace None)."""
    return key if isinstance(key, RadixKey) else RadixKey(key)

"""Token ids as the tree holds them: validation into int32 arrays, and a request's token buffer.

``to_token_array`` turns what a caller passes (a Python list, an integer numpy array or tensor)
into a private read-only int32 array, validated in the same pass: for a list or tuple, the C
extension ``hicache.radix.cpack`` (built by the install when a C compiler is there; about 1 ns
per id) and otherwise ``struct`` (the pure-Python path, 7-15 ns per id). ``TokenBuffer`` holds one
request's tokens (the prompt, then each generated token) converted once, as they arrive; a
``RadixKey`` over any prefix of it is a view, so a request's key is never rebuilt from lists.

Nothing is converted silently: bools, floats (even integral ones), strings, objects and nested
sequences raise ``TypeError``; negative or too large ids and arrays that are not 1-D raise
``ValueError``.
"""

from __future__ import annotations

import array
import operator
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hicache.checks import check_int

try:  # built by `pip install` where a C compiler is present (setup.py: optional)
    from hicache.radix.cpack import pack_ids as _pack_ids
except ImportError:  # pragma: no cover - exercised on installs without a compiler
    _pack_ids = None  # type: ignore[assignment]
NATIVE_PACK = _pack_ids is not None  # whether lists take the C path

TOKEN_DTYPE = np.int32
TOKEN_MAX = int(np.iinfo(TOKEN_DTYPE).max)
_RANGE = f"token_ids must be in [0, {TOKEN_MAX}]"
_C_INT = "i"  # struct / array.array C int: 4 bytes on every platform numpy and torch support
assert struct.calcsize(_C_INT) == array.array(_C_INT).itemsize == np.dtype(TOKEN_DTYPE).itemsize
_PACK_CHUNK = 16_384  # tokens per struct call on long lists (keeps its argument tuple in cache)
_PACK = struct.Struct(f"{_PACK_CHUNK}{_C_INT}")
# Sequences whose items are not token ids (array.array would read bytes-likes as raw bytes).
_NOT_ID_SEQUENCES = (str, bytes, bytearray, memoryview)
_MIN = np.minimum.reduce  # arr.min() without its Python wrapper (~0.1 us a call)
_BOOL_ERROR = "token_ids must be a sequence of ints, got a bool (True/False are not token ids)"


def _from_numpy(ids: np.ndarray) -> np.ndarray:
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {ids.shape}")
    if ids.size == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high > TOKEN_MAX:
        raise ValueError(f"{_RANGE}, got values in [{low}, {high}]")
    return np.array(ids, dtype=TOKEN_DTYPE)  # always a private copy


def _from_tensor(ids: torch.Tensor) -> np.ndarray:
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"token_ids must be integers, got dtype {ids.dtype}")
    return _from_numpy(ids.detach().cpu().numpy())


def _pack(ids: Sequence[Any]) -> np.ndarray:
    """``ids`` as read-only C ints in one C-level pass (``struct``: ints and ``__index__``
    scalars in int32 range; ``struct.error`` for anything else). About twice as fast as
    ``array.array`` and faster than ``np.fromiter`` on a list (``benchmarks/bench_keys.py``)."""
    n = len(ids)
    if n <= _PACK_CHUNK:  # a view of immutable bytes: read-only already
        return np.frombuffer(struct.pack(f"{n}{_C_INT}", *ids), dtype=TOKEN_DTYPE)
    out = np.empty(n, dtype=TOKEN_DTYPE)
    view, whole = out.data, n - n % _PACK_CHUNK
    for start in range(0, whole, _PACK_CHUNK):
        _PACK.pack_into(view, start * 4, *ids[start : start + _PACK_CHUNK])
    if whole < n:
        struct.pack_into(f"{n - whole}{_C_INT}", view, whole * 4, *ids[whole:])
    out.flags.writeable = False
    return out


def _from_sequence(ids: Sequence[Any], native: bool = True) -> np.ndarray:
    """A read-only validated int32 copy of ``ids``. A list or tuple of exact ints in range takes
    one pass of ``cpack.pack_ids`` when it is built; anything it stops at (an integer scalar,
    a bool, a bad id), and every sequence without it, takes the ``struct`` pass, which accepts
    integer scalars (``__index__``) and refuses floats, strings, None and nested sequences,
    then vectorised range and bool checks on the array."""
    if native and _pack_ids is not None and (type(ids) is list or type(ids) is tuple):
        out = np.empty(len(ids), dtype=TOKEN_DTYPE)
        if _pack_ids(ids, out) == len(out):
            out.flags.writeable = False
            return out
    try:
        arr = _pack(ids)
    except struct.error:  # not an int, or outside int32: array.array names which
        arr = _explain(ids)
        arr.flags.writeable = False
    if arr.size and _MIN(arr) <= 1:  # a negative id or a bool is a value <= 1
        _check_small(ids, arr)
    return arr


def _explain(ids: Sequence[Any]) -> np.ndarray:
    """The slow path for a sequence ``struct`` refused: ``TypeError`` / ``ValueError``."""
    try:
        return np.frombuffer(array.array(_C_INT, ids), dtype=TOKEN_DTYPE)
    except TypeError as exc:
        raise TypeError(f"token_ids must be a sequence of ints: {exc}") from None
    except OverflowError:
        raise ValueError(f"{_RANGE}, got a value outside int32") from None


def _check_small(ids: Sequence[Any], arr: np.ndarray) -> None:
    """For a non-empty ``arr`` holding a value ``<= 1``: ``ValueError`` for a negative id,
    ``TypeError`` if an item of ``ids`` is a bool. Only the positions ``<= 1`` are looked at
    (usually a handful per request), or every item in one C-level pass when they are many (an
    eighth or more)."""
    low = int(_MIN(arr))
    if low < 0:
        raise ValueError(f"{_RANGE}, got {low}")
    small = (arr <= 1).nonzero()[0]
    items = ids if small.size * 8 >= len(arr) else map(ids.__getitem__, small.tolist())
    if bool in set(map(type, items)):
        raise TypeError(_BOOL_ERROR)


def to_token_array(token_ids: Any, *, native: bool = True) -> np.ndarray:
    """Validate ``token_ids`` and return a private read-only 1-D int32 copy.

    Accepts a sequence of ints (or integer scalars), an integer numpy array or an integer torch
    tensor (any device; a CUDA tensor is copied to the CPU). Raises ``TypeError`` for non-integer
    ids (bools, floats even when integral, strings, None, objects, nested sequences) and
    ``ValueError`` for ids outside ``[0, 2**31 - 1]`` or an array that is not 1-D (also when
    it is empty, e.g. shape ``(0, 3)``). A list of ``n`` ids costs one C-level pass (about 1 ns
    per id with ``NATIVE_PACK``, 7-15 ns without); an array ``O(n)`` vectorised.
    ``native=False`` takes the pure-Python path even where the C one is built (the tests
    compare the two); the result and the errors are the same.
    """
    if type(token_ids) is list or type(token_ids) is tuple:  # the common case, first
        return _from_sequence(token_ids, native)  # read-only already
    if isinstance(token_ids, torch.Tensor):
        arr = _from_tensor(token_ids)
    elif isinstance(token_ids, np.ndarray):
        arr = _from_numpy(token_ids)
    elif isinstance(token_ids, Sequence) and not isinstance(token_ids, _NOT_ID_SEQUENCES):
        return _from_sequence(token_ids, native)
    else:
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    arr.flags.writeable = False
    return arr


def _check_token(token: Any) -> int:
    """One token id as an int: ``TypeError`` for a non-integer (bool included), ``ValueError``
    outside ``[0, 2**31 - 1]``."""
    if type(token) is not int:
        if isinstance(token, bool):
            raise TypeError("token must be an int, got a bool (True/False are not token ids)")
        try:
            token = operator.index(token)
        except TypeError:
            raise TypeError(f"token must be an int, got {type(token).__name__}") from None
    if not 0 <= token <= TOKEN_MAX:
        raise ValueError(f"token must be in [0, {TOKEN_MAX}], got {token}")
    return int(token)


class TokenBuffer:
    """Append-only token ids of one request, each converted and validated once.

    Positions ``[0, len)`` never change once written, so ``ids`` (and ``RadixKey(buffer)``) hand
    out read-only views (no copy) that stay valid while the buffer grows: growing moves the
    buffer to a new array and leaves the old one to the views that pin it. Appending is
    amortised O(1) per token (the capacity doubles); reserve the request's whole length up
    front to never move.

    Parameters
    ----------
    token_ids : the first tokens (the prompt), as ``to_token_array`` accepts them.
    capacity : tokens to reserve (e.g. prompt plus ``max_new_tokens``); at least ``len``.
    """

    __slots__ = ("_buf", "_len")

    def __init__(self, token_ids: Any = (), *, capacity: int = 0) -> None:
        ids = to_token_array(token_ids)
        check_int("capacity", capacity, minimum=0)
        self._buf = np.empty(max(capacity, len(ids)), dtype=TOKEN_DTYPE)
        self._buf[: len(ids)] = ids
        self._len = len(ids)

    def __len__(self) -> int:
        return self._len

    def append(self, token: Any) -> None:
        """Add one token (an int in ``[0, 2**31 - 1]``); raises before changing anything."""
        if type(token) is not int or not 0 <= token <= TOKEN_MAX:
            token = _check_token(token)
        if self._len == len(self._buf):
            self._reserve(1)
        self._buf[self._len] = token
        self._len += 1

    def extend(self, token_ids: Any) -> None:
        """Add ``token_ids`` (as ``to_token_array`` accepts them, validated first)."""
        ids = to_token_array(token_ids)
        self._reserve(len(ids))
        self._buf[self._len : self._len + len(ids)] = ids
        self._len += len(ids)

    def follow(self, prompt_len: int, output: Sequence[Any]) -> TokenBuffer:
        """Catch up with a request whose tokens are its prompt (the first ``prompt_len`` held
        here) and then ``output``, a list that only grows: appends the items of ``output``
        not yet held (each converted once, when first seen). Returns ``self``."""
        held = self._len - prompt_len
        if held == len(output) - 1:  # one token per decode step: the common case
            token = output[held]
            if type(token) is int and 0 <= token <= TOKEN_MAX and self._len < len(self._buf):
                self._buf[self._len] = token  # ``append``'s fast path, without its call
                self._len += 1
            else:
                self.append(token)
        elif held < len(output):
            self.extend(output[held:])
        return self

    def ids(self, end: int | None = None) -> np.ndarray:
        """Read-only int32 view ``[end]`` of the first ``end`` tokens (all by default)."""
        # the common case (an int in range) without a call
        stop = end if type(end) is int and 0 <= end <= self._len else self._check_end(end)
        view = self._buf[:stop]
        view.flags.writeable = False
        return view

    def __repr__(self) -> str:
        shown = self._buf[: min(self._len, 8)].tolist()
        return f"TokenBuffer({shown}{', ...' if self._len > 8 else ''}, len={self._len})"

    def _check_end(self, end: int | None) -> int:
        if end is None:
            return self._len
        if type(end) is not int:
            raise TypeError(f"end must be an int or None, got {type(end).__name__}")
        if not 0 <= end <= self._len:
            raise ValueError(f"end must be in [0, {self._len}] (the tokens held), got {end}")
        return end

    def _reserve(self, extra: int) -> None:
        need = self._len + extra
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf), 16), dtype=TOKEN_DTYPE)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown


class RequestTokens:
    """A request's ``prompt + output`` token lists mirrored in a ``TokenBuffer``.

    ``get`` returns the buffer caught up with the lists: the output tokens appended since the
    last call are converted (once each); when either list object was replaced, the buffer is
    rebuilt from the new lists. Editing a list in place other than appending to ``output`` is
    not seen (requests only ever append generated tokens).

    Parameters
    ----------
    capacity : tokens to reserve beyond the prompt (e.g. ``max_new_tokens``).
    """

    __slots__ = ("_buffer", "_prompt", "_output", "_extra")

    def __init__(self, prompt: Sequence[Any], output: Sequence[Any], capacity: int = 0) -> None:
        check_int("capacity", capacity, minimum=0)
        self._extra = capacity
        self._track(prompt, output)

    def get(self, prompt: Sequence[Any], output: Sequence[Any]) -> TokenBuffer:
        if prompt is not self._prompt or output is not self._output:
            self._track(prompt, output)
        return self._buffer.follow(len(prompt), output)

    def _track(self, prompt: Sequence[Any], output: Sequence[Any]) -> None:
        self._buffer = TokenBuffer(prompt, capacity=len(prompt) + self._extra)
        self._prompt, self._output = prompt, output

"""RadixKey: the token ids of a prefix plus the namespace (``extra_key``) they live in.

Token ids are held as one read-only, contiguous int32 numpy array (token ids are vocabulary
indices, far below 2**31), validated once when the key is built (``tokens.to_token_array``). The
tree compares pages of these arrays with vectorised numpy, so building a key from a Python list
(one C-level pass) is the only per-token Python cost; a request that keeps its tokens in a
``tokens.TokenBuffer`` pays it once per token, and its keys are views of that buffer.

The tree walks with ``match_len`` and ``page_bytes``: the C extension ``cpack``'s when it is
built (a memcmp over the buffers, no copy: ~0.2 us a node of 2k tokens, against ~1 us for numpy
slices and bytes copies), else the numpy versions (``numpy_match_len``, ``numpy_page_bytes``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterator
from typing import Any, cast

import numpy as np

from hicache.radix.tokens import TOKEN_DTYPE, TokenBuffer, to_token_array

__all__ = [
    "BYTES_COMPARE_MAX",
    "TOKEN_DTYPE",
    "RadixKey",
    "as_radix_key",
    "as_token_array",
    "check_extra_key",
    "common_prefix_len",
    "edge_ids",
    "match_len",
    "numpy_match_len",
    "numpy_page_bytes",
    "page_bytes",
]

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
        atom: Hashable | None = extra_key  # no ``cast`` call: every key is built through here
        return atom
    stack = [extra_key]
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            stack.extend(item)
        elif type(item) not in _EXTRA_KEY_ATOMS:
            raise TypeError(f"{_EXTRA_KEY_RULE}; got {type(item).__name__} {item!r:.60}")
    return cast(Hashable, extra_key)


def as_token_array(token_ids: Any) -> np.ndarray:
    """Validated read-only 1-D int32 token ids of ``token_ids``.

    A RadixKey or a ``TokenBuffer`` (already validated) gives its ids without a copy; anything
    else gets a private validated copy (``tokens.to_token_array``: a sequence of ints or integer
    scalars, an integer numpy array or an integer tensor on any device). Raises ``TypeError``
    for non-integer ids (bools, floats even when integral, strings, None, objects, nested
    sequences) and ``ValueError`` for ids outside ``[0, 2**31 - 1]`` or an array that is not
    1-D (also when it is empty, e.g. shape ``(0, 3)``).
    """
    if isinstance(token_ids, RadixKey):
        return token_ids.token_ids
    if isinstance(token_ids, TokenBuffer):
        return token_ids.ids()
    return to_token_array(token_ids)


def edge_ids(ids: np.ndarray) -> np.ndarray:
    """A slice of a RadixKey's (read-only) ids as a node may keep it: the slice itself when it
    covers at least half of the buffer it views, else a copy. A node thus pins at most twice its
    own key bytes, and the common insert (a new tail making up most of the request) copies
    nothing.
    """
    base = ids.base
    if isinstance(base, np.ndarray) and 2 * ids.nbytes >= base.nbytes:
        return ids
    return np.array(ids)  # a private copy


BYTES_COMPARE_MAX = 4096  # tokens; above this a bytes copy costs more than numpy's compare


def common_prefix_len(a: np.ndarray, b: np.ndarray, page_size: int) -> int:
    """Length of the common prefix of ``a`` and ``b`` rounded down to whole pages.

    Both lengths must be page multiples. Short equal runs (the common case) are settled by one
    bytes comparison; otherwise one vectorised comparison. No per-token loop.
    """
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if n <= BYTES_COMPARE_MAX and a.tobytes() == b.tobytes():
        return n
    ne = np.not_equal(a, b)
    first = int(ne.argmax())
    if not ne[first]:
        return n
    return first - first % page_size


def numpy_match_len(key: np.ndarray, ids: np.ndarray, pos: int, stop: int, page: int) -> int:
    """Leading tokens of ``key`` equal to ``ids[pos:stop]``, rounded down to whole pages of
    ``page`` tokens (``0 <= pos <= stop <= len(ids)``): the numpy form of ``match_len``."""
    return common_prefix_len(key, ids[pos:stop], page)


def numpy_page_bytes(ids: np.ndarray, pos: int, page: int) -> bytes:
    """The bytes of ``ids[pos:pos + page]``: the numpy form of ``page_bytes``."""
    return ids[pos : pos + page].tobytes()


try:  # built by `pip install` where a C compiler is present (setup.py: optional)
    from hicache.radix.cpack import match_len as _c_match_len
    from hicache.radix.cpack import page_bytes as _c_page_bytes
except ImportError:  # pragma: no cover - exercised on installs without a compiler
    _c_match_len = _c_page_bytes = None  # type: ignore[assignment]

# what the tree walks with: cpack's (C-contiguous int32 buffers, no copy) or numpy's
match_len: Callable[[np.ndarray, np.ndarray, int, int, int], int] = (
    numpy_match_len if _c_match_len is None else _c_match_len
)
page_bytes: Callable[[np.ndarray, int, int], bytes] = (
    numpy_page_bytes if _c_page_bytes is None else _c_page_bytes
)


class RadixKey:
    """Token ids of a prefix and the namespace they are cached in.

    Parameters
    ----------
    token_ids : sequence of non-negative ints, integer numpy array or integer tensor, copied into
        a read-only int32 numpy array ``[len]`` on the CPU; or a ``TokenBuffer`` (or RadixKey),
        whose current tokens are viewed without a copy.
    extra_key : namespace (LoRA id, tenant salt) or None: None, ``str``, ``bytes``, ``int``
        (not ``bool``) or a tuple of these, nested to any depth, all of exactly these built-in
        types; anything else (float, bool, enums, numpy scalars, lists) raises ``TypeError``
        (``check_extra_key``). Namespaces are equal when their values are equal: ``1``,
        ``"1"``, ``b"1"`` and ``(1,)`` are four namespaces. Keys with different ``extra_key``
        never share a tree node, not even their first page.

    Slicing (``key[a:b]``) returns a RadixKey viewing the same ids in the same namespace; an
    int index (``key[i]``) the one-token key at ``i``, and iteration yields Python ints, both
    as in SGLang. Unlike SGLang's list, ``token_ids`` is a numpy array: compare it with
    ``.tolist()`` (or compare keys, or ``list(key)``).
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Any, extra_key: Hashable | None = None) -> None:
        self.extra_key = check_extra_key(extra_key)
        if type(token_ids) is list:  # what schedulers pass: straight to the conversion
            self.token_ids: np.ndarray = to_token_array(token_ids)
        else:
            self.token_ids = as_token_array(token_ids)

    @classmethod
    def from_validated(cls, token_ids: np.ndarray, extra_key: Hashable | None) -> RadixKey:
        """A key over an already validated read-only contiguous int32 array (no copy). Only the
        namespace is checked (``check_extra_key``, O(1) for an atom): callers such as ``kv_key``
        pass a request's ``extra_key`` here unvalidated."""
        key = cls.__new__(cls)
        key.token_ids = token_ids
        # an atom (the common namespace) is valid as is: ``check_extra_key``'s first test
        atom = type(extra_key) in _EXTRA_KEY_ATOMS
        key.extra_key = extra_key if atom else check_extra_key(extra_key)
        return key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids.tolist())

    def __getitem__(self, item: slice | int) -> RadixKey:
        """``key[a:b]``: the key viewing those ids; ``key[i]``: the one-token key at ``i``
        (negative counts from the end; ``IndexError`` outside ``[-len, len)``)."""
        ids = self.token_ids
        if type(item) is not slice:
            i = operator.index(item)  # TypeError for a non-integer index
            if not -len(ids) <= i < len(ids):
                raise IndexError(f"RadixKey index {i} out of range for {len(ids)} tokens")
            i %= len(ids)
            item = slice(i, i + 1)
        part = ids[item]
        if not part.flags.c_contiguous:  # a step: a private copy keeps the ids contiguous
            part = np.ascontiguousarray(part)
            part.flags.writeable = False
        return RadixKey.from_validated(part, self.extra_key)

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

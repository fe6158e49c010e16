"""The page hash: one chained SHA-256 per full page, shared by the tree, storage and KV events.

``hash(page i) = sha256(hash(page i - 1) || tokens of page i as little-endian uint32)``; the
first page of a prefix chains from the namespace seed (``namespace_seed``), or from nothing in
the default namespace. The bytes equal SGLang's per-page ``get_hash_str`` (its digest, not the
hex), so a chain names a whole prefix: equal hashes mean equal prefixes in one namespace.

A node's hashes are computed once, when first needed (``node_hashes``), and kept in
``TreeNode.hash_value``; ``RadixTree.split`` divides them between the halves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np

from hicache.checks import check_int
from hicache.radix.key import check_extra_key
from hicache.radix.node import TreeNode

__all__ = ["NAMESPACE_TAG", "namespace_seed", "node_hashes", "page_hashes"]

NAMESPACE_TAG = b"hicache-ns-v1\0"
# Frame tags: one byte naming the type of each part of an ``extra_key`` (0: absent).
_NONE, _BYTES, _STR, _INT, _TUPLE = b"\0", b"\1", b"\2", b"\3", b"\4"


def page_hashes(ids: np.ndarray, page_size: int, prior: bytes | None) -> list[bytes]:
    """The chained 32-byte digests of the full pages of ``ids``.

    Parameters
    ----------
    ids : int32 numpy ``[n]`` (CPU), token ids; a partial last page is ignored.
    page_size : tokens per page (>= 1).
    prior : the digest the first page chains from (the previous page's hash, or a namespace
        seed), or None for an unseeded chain.

    One ``sha256`` per page over a bytes view of the page; no per-token Python loop.
    ``TypeError`` unless ``ids`` is a 1-D integer numpy array; ``page_size`` as ``check_int``.
    """
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be a 1-D integer numpy array, got {type(ids).__name__}")
    check_int("page_size", page_size, minimum=1)
    width = 4 * page_size  # bytes per page
    data = ids.astype("<u4").tobytes()
    sha, chained, out = hashlib.sha256, prior or b"", []
    for start in range(0, len(data) - len(data) % width, width):
        chained = sha(chained + data[start : start + width]).digest()
        out.append(chained)
    return out


def namespace_seed(extra_key: Hashable | None) -> bytes | None:
    """The digest a namespace's chains start from: None for the default namespace (None), else
    ``sha256(NAMESPACE_TAG + frame(extra_key))``.

    ``frame`` writes one tag byte per part, then for ``bytes`` an 8-byte little-endian length
    and the bytes, for ``str`` the same over its UTF-8, for ``int`` the same over its minimal
    big-endian two's-complement bytes (``(bit_length + 8) // 8`` of them), for a tuple the
    8-byte item count followed by each item's frame, and for None (inside a tuple) the tag
    alone. Every valid ``extra_key`` (``key.check_extra_key``) has one frame and no two share
    one: ``1``, ``"1"``, ``b"1"`` and ``(1,)`` seed four chains, ``("a", "bc") != ("ab", "c")``.
    ``TypeError`` (``check_extra_key``) for anything else.
    """
    if check_extra_key(extra_key) is None:
        return None
    return hashlib.sha256(NAMESPACE_TAG + _frame(extra_key)).digest()


def _frame(extra_key: Hashable) -> bytes:
    parts: list[bytes] = []
    stack: list[object] = [extra_key]  # pre-order, iterative: tuples nest to any depth
    while stack:
        item = stack.pop()
        if item is None:
            parts.append(_NONE)
        elif type(item) is tuple:
            parts += (_TUPLE, len(item).to_bytes(8, "little"))
            stack.extend(reversed(item))
        else:
            tag, raw = _atom(item)
            parts += (tag, len(raw).to_bytes(8, "little"), raw)
    return b"".join(parts)


def _atom(item: object) -> tuple[bytes, bytes]:
    if type(item) is bytes:
        return _BYTES, item
    if type(item) is str:
        return _STR, item.encode("utf-8")
    assert type(item) is int, f"not a valid extra_key part: {item!r:.60}"
    return _INT, item.to_bytes((item.bit_length() + 8) // 8, "big", signed=True)


def node_hashes(node: TreeNode, page_size: int) -> list[bytes]:
    """``node.hash_value``, computed first (with any ancestors' that lack it) when missing.

    ``node`` is a node below the root (its key whole pages); its first page chains from its
    parent's last page hash, or from ``namespace_seed(node.extra_key)`` under the root.
    """
    missing: list[TreeNode] = []
    current: TreeNode | None = node
    while current is not None and current.parent is not None and current.hash_value is None:
        missing.append(current)
        current = current.parent
    for n in reversed(missing):  # root side first: each parent's hashes exist when needed
        n.hash_value = page_hashes(n.key, page_size, _prior(n))
    assert node.hash_value is not None, "node_hashes of the root"
    return node.hash_value


def _prior(node: TreeNode) -> bytes | None:
    parent = node.parent
    assert parent is not None
    if parent.parent is None:  # under the root
        return namespace_seed(node.extra_key)
    assert parent.hash_value is not None
    return parent.hash_value[-1]

"""The trailer every stored page object carries: the page's checksum and the object's digest.

A stored object (one per host-pool part of a page) is its ``object_bytes`` payload followed by
a trailer of ``trailer_bytes(layers)`` bytes::

    MAGIC (8 bytes) | page checksum: int64 [layers] (little-endian) | digest: uint64

* The **page checksum** is the host tier's (:mod:`hicache.kernels.checksum`, one 63-bit value
  per layer over every part of the page), taken once, on the device, where the page's bytes are
  first written to a lower tier (the host backup). It travels with the page: host -> storage
  object -> host (a read hands it to the host tier's store) -> device (``verify`` checks the
  loaded copy against it). ``NO_SUM`` (-1 in every layer) when the writer kept none
  (``verify="off"``); a reader with ``verify`` on then leaves that page unchecked at load-back.
* The **digest** is xxh3-64 over the payload, seeded by the hash of ``MAGIC``, the page checksum
  and the object's key: a reader checks it before the page can be adopted, at ~20x the speed of
  a copy on the CPU, so a flipped bit, a zeroed tail, a torn write, an object renamed under
  another key or one of an older format is a counted miss (``checksum_mismatch``), never served.

So one value covers a page end to end: storage reads are checked by the digest, and the digest
covers the page checksum that the device checks at load-back.
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = ["MAGIC", "check_trailer", "make_trailer", "sums_of", "trailer_bytes"]

MAGIC = b"hcsum\x02\x00\x00"
_DIGEST = 8


def trailer_bytes(layers: int) -> int:
    """Bytes of the trailer of a page of ``layers`` layers."""
    return len(MAGIC) + 8 * layers + _DIGEST


def _digest(payload: np.ndarray, head: bytes, key: str) -> bytes:
    """xxh3-64 of ``payload`` seeded with xxh3-64 of ``head`` and ``key`` (one pass over the
    payload, no hasher object: the cost of a read is the payload's hash alone)."""
    seed = xxhash.xxh3_64_intdigest(head + key.encode())
    return xxhash.xxh3_64_digest(payload.data, seed)


def make_trailer(key: str, payload: np.ndarray, sums: np.ndarray) -> bytes:
    """The trailer of object ``key`` with ``payload`` (1-D uint8) and the page checksum ``sums``
    (int64 ``[layers]``)."""
    head = MAGIC + np.ascontiguousarray(sums, "<i8").tobytes()
    return head + _digest(payload, head, key)


def check_trailer(
    key: str, payload: np.ndarray, raw: bytes | bytearray | memoryview
) -> bytes | None:
    """The page checksum (``sums_of`` reads it) that ``raw``, the trailer read with object
    ``key`` and its ``payload``, carries; None when the digest does not match (a damaged
    object, another key's or another format's)."""
    data = bytes(raw)
    head, digest = data[:-_DIGEST], data[-_DIGEST:]
    if len(data) <= len(MAGIC) + _DIGEST or not head.startswith(MAGIC):
        return None
    if _digest(payload, head, key) != digest:
        return None
    return head[len(MAGIC) :]


def sums_of(carried: bytes) -> np.ndarray:
    """int64 ``[layers]``: the page checksum ``check_trailer`` returned."""
    return np.frombuffer(carried, "<i8").astype(np.int64)

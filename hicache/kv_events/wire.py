"""SGLang's KV event wire format, written with msgspec Structs of our own.

A payload is a msgpack ``KVEventBatch``, an array ``[ts, events, attn_dp_rank]``; each event a
map tagged by its class name (``{"type": "BlockStored", ...}``) with SGLang's fields in
SGLang's order, optional ones left out when None (SGLang 0.5.10 and later, and vLLM; SGLang
0.5.9 and earlier sent events as arrays). ``BlockStored``: ``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id`` (always None), ``medium``,
``cache_salt``; ``BlockRemoved``: ``block_hashes``, ``medium``; ``AllBlocksCleared``.

A block hash is the signed int64 of the first 8 bytes, big-endian, of the page's 32-byte
chained SHA-256 (``block_int``): SGLang's ``hash_str_to_int64`` of the same digest, so in the
default namespace the ints equal SGLang's for the same tokens and page size.
"""

from __future__ import annotations

import msgspec

from hicache.radix.events import BlockRemoved as PageRemoved
from hicache.radix.events import BlockStored as PageStored
from hicache.radix.events import KVEvent

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "block_int",
    "decode_batch",
    "encode_batch",
    "to_wire",
]


class _Event(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """A tagged event: a msgpack map whose ``type`` is the class name."""


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(_Event):
    pass


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[WireEvent]
    attn_dp_rank: int | None = None


def block_int(digest: bytes) -> int:
    """The int64 a 32-byte page digest is published as: its first 8 bytes, big-endian,
    signed."""
    return int.from_bytes(digest[:8], "big", signed=True)


def to_wire(event: KVEvent) -> WireEvent:
    """``event`` (``hicache.radix.events``) as its wire Struct. ``cache_salt`` is the page's
    namespace when that is a str (None otherwise: the hashes carry the namespace anyway)."""
    if isinstance(event, PageStored):
        parent = event.parent_block_hash
        salt = event.namespace if isinstance(event.namespace, str) else None
        return BlockStored(
            [block_int(h) for h in event.block_hashes],
            None if parent is None else block_int(parent),
            list(event.token_ids),
            event.block_size,
            None,
            event.medium,
            salt,
        )
    if isinstance(event, PageRemoved):
        return BlockRemoved([block_int(h) for h in event.block_hashes], event.medium)
    return AllBlocksCleared()


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(events: list[KVEvent], ts: float, attn_dp_rank: int | None) -> bytes:
    """The msgpack payload of one batch of ``events`` taken at ``ts`` (seconds since the
    epoch)."""
    return _ENCODER.encode(KVEventBatch(ts, [to_wire(e) for e in events], attn_dp_rank))


def decode_batch(payload: bytes) -> KVEventBatch:
    """``payload`` decoded; ``msgspec.DecodeError`` (a ``ValueError``) if it is not one."""
    return _DECODER.decode(payload)

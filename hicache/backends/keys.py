"""Storage keys: a page's chained hash, scoped by what makes its KV bytes valid.

``page key = f"hc2_{fingerprint}_{page_hash.hex()}_{shard}"`` and one object per host-pool part,
``f"{page key}_{part}"`` (``k``/``v`` for MHA, ``kv`` for MLA's latent). The page hash
(``hicache.radix.page_hash``) already carries the request's namespace (``extra_key`` and
``cache_salt`` seed the chain), so one tenant's keys never name another's pages. The
fingerprint changes whenever the bytes would mean something else: another model or revision
(or weights digest), KV dtype, head count, head dim, layer count, page size or host layout,
and for a hybrid model its layer pattern, inner pools and recurrent state shapes (``pattern``).
The shard names the TP rank (``r{rank}of{size}``) for MHA, whose ranks hold different heads;
MLA ranks hold identical latents, so the shard is ``mla``: rank 0 writes, every rank reads.
Characters are ``[0-9a-z_]`` only: a key is also a file name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from hicache.checks import check_int

__all__ = ["KVFingerprint", "StorageKeys", "check_keys", "object_keys"]

KEY_VERSION = "hc2"  # hc2: objects carry a trailer (page_sum); hc1 objects are never read
PART_NAMES = {1: ("kv",), 2: ("k", "v")}
MAX_KEY_CHARS = 160  # a page key plus its part, ".bin" and a temporary suffix fit a file name
_KEY_CHARS = re.compile(r"[0-9a-z_]+")


@dataclass(frozen=True)
class KVFingerprint:
    """Everything that makes a page's KV bytes valid; ``digest`` is its 16-hex-char name."""

    model_id: str
    model_revision: str
    kv_dtype: str
    head_num: int
    head_dim: int
    layer_num: int
    page_size: int
    layout: str
    is_mla: bool
    pattern: str = ""  # a hybrid model's layer pattern, inner pools and state shapes ("": none)

    def __post_init__(self) -> None:
        for name in ("model_id", "model_revision", "kv_dtype", "layout", "pattern"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        for name in ("head_num", "head_dim", "layer_num", "page_size"):
            check_int(name, getattr(self, name), minimum=1)
        if not isinstance(self.is_mla, bool):
            raise TypeError(f"is_mla must be a bool, got {type(self.is_mla).__name__}")

    @property
    def digest(self) -> str:
        """sha256 over the length-framed fields (``pattern`` only when set, so the digests
        of full-attention models never change), first 16 hex chars."""
        sha = hashlib.sha256(b"hicache-fp-v1\0")
        pattern = (self.pattern,) if self.pattern else ()
        for value in (
            self.model_id,
            self.model_revision,
            self.kv_dtype,
            self.head_num,
            self.head_dim,
            self.layer_num,
            self.page_size,
            self.layout,
            self.is_mla,
            *pattern,
        ):
            raw = str(value).encode("utf-8")
            sha.update(len(raw).to_bytes(8, "little") + raw)
        return sha.hexdigest()[:16]


@dataclass(frozen=True)
class StorageKeys:
    """Builds the page keys of one TP rank of one model (``fingerprint``)."""

    fingerprint: KVFingerprint
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, KVFingerprint):
            kind = type(self.fingerprint).__name__
            raise TypeError(f"fingerprint must be a KVFingerprint, got {kind}")
        check_int("tp_size", self.tp_size, minimum=1)
        check_int("tp_rank", self.tp_rank)
        if self.tp_rank >= self.tp_size:
            raise ValueError(f"tp_rank must be < tp_size={self.tp_size}, got {self.tp_rank}")

    @property
    def shard(self) -> str:
        if self.fingerprint.is_mla:
            return "mla"
        return f"r{self.tp_rank}of{self.tp_size}"

    @property
    def writes(self) -> bool:
        """Whether this rank backs pages up (MLA: rank 0 only; MHA: every rank its shard)."""
        return not self.fingerprint.is_mla or self.tp_rank == 0

    def page_keys(self, page_hashes: list[bytes]) -> list[str]:
        """One key per 32-byte page digest, in order."""
        head = f"{KEY_VERSION}_{self.fingerprint.digest}_"
        tail = f"_{self.shard}"
        return [head + h.hex() + tail for h in page_hashes]

    def page_hash(self, page_key: str) -> bytes | None:
        """The 32-byte page digest ``page_key`` names, or None for a key of another model,
        shard or shape (``page_keys``' inverse)."""
        head = f"{KEY_VERSION}_{self.fingerprint.digest}_"
        middle = page_key.removeprefix(head).removesuffix(f"_{self.shard}")
        if len(middle) != 64 or len(page_key) != len(head) + 64 + len(self.shard) + 1:
            return None
        try:
            return bytes.fromhex(middle)
        except ValueError:
            return None


def object_keys(page_key: str, parts: int) -> list[str]:
    """The object keys of one page: one per host-pool part (2: K and V; 1: MLA latent)."""
    return [f"{page_key}_{name}" for name in PART_NAMES[parts]]


def check_keys(keys: Any) -> list[str]:
    """``keys`` if a list of page keys: ``TypeError`` unless a list of str, ``ValueError``
    unless each is 1 to ``MAX_KEY_CHARS`` characters of ``[0-9a-z_]`` (a key is a file name)."""
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise TypeError("keys must be a list of str")
    for key in keys:
        if len(key) > MAX_KEY_CHARS or not _KEY_CHARS.fullmatch(key):
            raise ValueError(
                f"keys must be 1 to {MAX_KEY_CHARS} characters of [0-9a-z_], got {key[:200]!r}"
            )
    return keys

"""Storage keys: the fingerprint's bytes, shards, key shapes and their checks."""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np
import pytest

from hicache.backends.keys import (
    MAX_KEY_CHARS,
    KVFingerprint,
    StorageKeys,
    check_keys,
    object_keys,
)
from hicache.radix.page_hash import namespace_seed, page_hashes

FP = KVFingerprint("org/model", "abc123", "torch.bfloat16", 8, 128, 32, 64, "page_first", False)
MLA = dataclasses.replace(FP, head_num=1, head_dim=576, is_mla=True)
CHANGES = {
    "model_id": "org/other",
    "model_revision": "abc124",
    "kv_dtype": "torch.float8_e4m3fn",
    "head_num": 4,
    "head_dim": 64,
    "layer_num": 31,
    "page_size": 32,
    "layout": "layer_first",
    "is_mla": True,
    "pattern": "([(0, (0, False))], 0)",
}


def _framed_digest(fp: KVFingerprint) -> str:
    """The documented format, rebuilt: sha256 over a tag and each field length-framed
    (``pattern`` only when set)."""
    sha = hashlib.sha256(b"hicache-fp-v1\0")
    for field in dataclasses.fields(fp):
        if field.name == "pattern" and not fp.pattern:
            continue
        raw = str(getattr(fp, field.name)).encode()
        sha.update(len(raw).to_bytes(8, "little") + raw)
    return sha.hexdigest()[:16]


def test_the_fingerprint_digest_is_the_framed_sha256() -> None:
    assert FP.digest == _framed_digest(FP)
    hybrid = dataclasses.replace(FP, pattern=CHANGES["pattern"])
    assert hybrid.digest == _framed_digest(hybrid)
    assert re.fullmatch(r"[0-9a-f]{16}", FP.digest)
    assert KVFingerprint(*dataclasses.astuple(FP)).digest == FP.digest


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_every_field_changes_the_fingerprint(name: str) -> None:
    assert dataclasses.replace(FP, **{name: CHANGES[name]}).digest != FP.digest


def test_framing_keeps_field_boundaries() -> None:
    a = dataclasses.replace(FP, model_id="ab", model_revision="c")
    b = dataclasses.replace(FP, model_id="a", model_revision="bc")
    assert a.digest != b.digest


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"model_id": 1}, TypeError),
        ({"layout": None}, TypeError),
        ({"head_num": 0}, ValueError),
        ({"page_size": 1.0}, TypeError),
        ({"is_mla": 1}, TypeError),
    ],
)
def test_fingerprint_fields_are_checked(change: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        dataclasses.replace(FP, **change)


def test_page_keys_name_hash_fingerprint_and_shard() -> None:
    ids = np.arange(256, dtype=np.int32)
    hashes = page_hashes(ids, 64, namespace_seed("tenant"))
    keys = StorageKeys(FP, tp_rank=1, tp_size=2).page_keys(hashes)
    assert keys == [f"hc2_{FP.digest}_{h.hex()}_r1of2" for h in hashes]
    assert check_keys(keys) is keys
    assert StorageKeys(FP).page_keys(hashes) != keys  # another rank's heads
    assert StorageKeys(FP).page_keys(page_hashes(ids, 64, namespace_seed("other"))) != keys
    assert StorageKeys(FP).page_keys([]) == []


def test_mla_ranks_share_keys_and_only_rank_zero_writes() -> None:
    hashes = page_hashes(np.arange(64, dtype=np.int32), 64, None)
    ranks = [StorageKeys(MLA, tp_rank=r, tp_size=4) for r in range(4)]
    assert len({tuple(k.page_keys(hashes)) for k in ranks}) == 1
    assert ranks[0].shard == "mla"
    assert [k.writes for k in ranks] == [True, False, False, False]
    assert all(StorageKeys(FP, tp_rank=r, tp_size=4).writes for r in range(4))


@pytest.mark.parametrize(
    ("rank", "size", "error"), [(2, 2, ValueError), (-1, 2, ValueError), (0, 0, ValueError)]
)
def test_tp_shard_is_checked(rank: int, size: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        StorageKeys(FP, tp_rank=rank, tp_size=size)


def test_object_keys_one_per_part() -> None:
    assert object_keys("p", 2) == ["p_k", "p_v"]
    assert object_keys("p", 1) == ["p_kv"]


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        (("a",), TypeError),
        ("abc", TypeError),
        ([b"a"], TypeError),
        ([""], ValueError),
        (["A"], ValueError),
        (["a/b"], ValueError),
        (["a.b"], ValueError),
        (["a b"], ValueError),
        (["x" * (MAX_KEY_CHARS + 1)], ValueError),
    ],
)
def test_check_keys_rejects(keys: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_keys(keys)


def test_check_keys_accepts_file_name_keys() -> None:
    assert check_keys([]) == []
    assert check_keys(["a_0", "x" * MAX_KEY_CHARS]) == ["a_0", "x" * MAX_KEY_CHARS]


@pytest.mark.parametrize("fingerprint", ["x", FP.digest, None])
def test_the_fingerprint_must_be_a_kvfingerprint(fingerprint: object) -> None:
    with pytest.raises(TypeError, match="fingerprint must be a KVFingerprint"):
        StorageKeys(fingerprint)  # type: ignore[arg-type]

"""The wire format: our Structs encode what SGLang's own classes decode, hashes as int64."""

from __future__ import annotations

import hashlib

import pytest

from hicache.kv_events import KVEventsConfig, make_sink
from hicache.kv_events.wire import block_int, decode_batch, encode_batch
from hicache.radix.events import AllBlocksCleared, BlockRemoved, BlockStored, EventQueue
from tests.kv_events import sglang_structs as sgl

A, B = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()


def test_sglang_decodes_our_batches_field_for_field() -> None:
    events = [
        AllBlocksCleared(),
        BlockStored((A,), None, (1, 2), 2, "GPU", "tenant"),
        BlockStored((B,), A, (3, 4), 2, "DISK", ("lora", 7)),
        BlockRemoved((A,), "CPU_PINNED"),
    ]
    batch = sgl.decoder.decode(encode_batch(events, 12.5, 3))
    assert (batch.ts, batch.attn_dp_rank) == (12.5, 3)
    cleared, first, second, removed = batch.events
    assert isinstance(cleared, sgl.AllBlocksCleared)
    assert first == sgl.BlockStored([block_int(A)], None, [1, 2], 2, None, "GPU", "tenant")
    assert second == sgl.BlockStored([block_int(B)], block_int(A), [3, 4], 2, None, "DISK")
    assert removed == sgl.BlockRemoved([block_int(A)], "CPU_PINNED")
    assert decode_batch(encode_batch(events, 12.5, 3)).events[1].cache_salt == "tenant"


def test_block_hash_is_sglangs_hash_str_to_int64_of_the_digest() -> None:
    for digest in (A, B, b"\xff" * 32, b"\x80" + b"\0" * 31):
        unsigned = int(digest.hex()[:16], 16)  # sglang.srt.mem_cache.utils.hash_str_to_int64
        assert block_int(digest) == (unsigned - 2**64 if unsigned >= 2**63 else unsigned)


def test_medium_keeps_tier_as_an_alias() -> None:
    assert BlockStored((A,), None, (1,), 1, "CPU_PINNED", None).tier == "host"
    assert BlockRemoved((A,), "EXTERNAL").tier == "storage"


@pytest.mark.parametrize(
    ("setting", "error"),
    [(5557, TypeError), ("localhost:5557", ValueError), (KVEventsConfig, TypeError)],
)
def test_bad_settings_are_refused(setting: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="kv_events|endpoint"):
        make_sink(setting)


def test_config_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="replay_endpoint must differ"):
        KVEventsConfig("tcp://127.0.0.1:1", "tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="max_queue_size"):
        KVEventsConfig(max_queue_size=0)
    for linger in (-1, "1", True):
        with pytest.raises(ValueError, match="replay_linger_s"):
            KVEventsConfig(replay_linger_s=linger)  # type: ignore[arg-type]
    queue = EventQueue()
    assert make_sink(queue) is queue and make_sink(None) is None

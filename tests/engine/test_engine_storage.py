"""The engine over a real storage tier (the file store): a second engine with empty device and
host tiers serves the first one's prompts from storage with cache-free logits, and tenant
salts keep their pages apart."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hicache.backends import StorageConfig
from hicache.engine import CacheSpec, Engine, EngineConfig, Request, Status, build_engine
from hicache.model import ModelConfig, TinyTransformer
from hicache.radix import HiCacheConfig
from tests.engine.helpers import assert_matches_reference, assert_no_leak

MHA = ModelConfig(attention="mha", num_layers=2)
RECORD = EngineConfig(max_running_requests=4, max_prefill_tokens=64, record_logits=True)


def file_engine(root: Path, policy: str = "wait_complete") -> Engine:
    storage = StorageConfig(
        backend="file",
        extra_config={"root": str(root)},
        model_id="tiny",
        prefetch_threshold=8,
        prefetch_policy=policy,
    )
    spec = CacheSpec(
        kind="hiradix",
        device_tokens=256,
        page_size=4,
        max_context_len=512,
        max_requests=8,
        hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=4, storage=storage),
    )
    return build_engine(TinyTransformer(MHA), spec, RECORD)


def serve(engine: Engine, prompts: list[list[int]], salt: str | None = None) -> list[Request]:
    reqs = [engine.submit(p, 4, cache_salt=salt) for p in prompts]
    engine.run()
    engine.cache.drain_transfers()
    assert all(r.status is Status.FINISHED for r in reqs)
    return reqs


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(MHA.vocab_size) for _ in range(length)] for _ in range(n)]


def test_a_fresh_engine_is_served_from_storage_with_cache_free_logits(tmp_path: Path) -> None:
    batch = prompts(3, 61, seed=0)
    first = serve(file_engine(tmp_path), batch)
    assert all(r.storage_hit == 0 for r in first)
    fresh = file_engine(tmp_path)
    again = serve(fresh, batch)
    assert [r.storage_hit for r in again] == [60, 60, 60]  # whole pages of prompt[:-1]
    assert all(r.device_hit == r.host_hit == 0 and r.computed == 1 for r in again)
    assert [r.output_ids for r in again] == [r.output_ids for r in first]
    assert_matches_reference(fresh, again, atol=1e-5)
    assert_no_leak(fresh)
    stats = fresh.cache.stats().storage
    assert stats is not None and stats.prefetch_loaded_tokens == 180 and stats.bytes_read > 0


@pytest.mark.parametrize(("salt", "hit"), [("tenant-a", 60), ("tenant-b", 0), (None, 0)])
def test_only_the_same_salt_reads_a_tenants_pages(tmp_path: Path, salt, hit: int) -> None:
    batch = prompts(1, 61, seed=1)
    serve(file_engine(tmp_path), batch, salt="tenant-a")
    fresh = file_engine(tmp_path)
    (req,) = serve(fresh, batch, salt=salt)
    assert req.storage_hit == hit and req.computed == len(batch[0]) - hit
    assert_matches_reference(fresh, [req], atol=1e-5)


def test_the_cache_says_whether_storage_is_attached_until_closed(tmp_path: Path) -> None:
    engine = file_engine(tmp_path)
    noted: list[object] = []
    note = engine.cache.note_prefill
    engine.cache.note_prefill = lambda *args: noted.append(args) or note(*args)
    assert engine.cache.has_storage_tier()
    serve(engine, prompts(1, 21, seed=3))
    assert [tokens for tokens, _ in noted] == [21]  # the prompt computed, then decode only
    engine.cache.close()
    assert not engine.cache.has_storage_tier()

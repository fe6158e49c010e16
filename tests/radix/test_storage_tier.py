"""The storage tier through HiRadixCache: backup after the host write, prefetch into host-only
nodes, byte-exact load-back, namespaces and fingerprints, policies, the cost model, misuse."""

from __future__ import annotations

import threading

import pytest
import torch

from hicache.backends.memory import MemoryStorage
from hicache.radix import RadixKey
from tests.radix.storage_helpers import (
    CASES,
    PAGE,
    kv_of,
    load,
    make_stack,
    prefetch,
    random_ids,
    storage_config,
    wait_for,
    write_prefix,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mla", "layout", "io_backend"), CASES)
def test_round_trip_device_host_storage_host_device(tmp_path, mla, layout, io_backend, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = storage_config(tmp_path)
    ids = random_ids(64)
    writer = make_stack(cfg, mla=mla, layout=layout, io_backend=io_backend, device=device)
    expected = write_prefix(writer, ids, seed=3)
    assert writer.cache.stats().storage.backup_pages == 64 // PAGE
    reader = make_stack(cfg, mla=mla, layout=layout, io_backend=io_backend, device=device)
    for part in reader.kv_pool.part_buffers:  # poison: unwritten bytes show
        for layer in part:
            layer.fill_(-7.0)
    assert prefetch(reader.cache, "r", ids) == 64
    host_hit, slots = load(reader, ids)
    assert host_hit == 64 and len(slots) == 64
    for want, got in zip(expected, kv_of(reader, slots), strict=True):
        assert torch.equal(want, got)
    reader.cache.check_invariants()
    stats = reader.cache.stats().storage
    assert stats.hit_pages == 16 and stats.prefetch_loaded_tokens == 64 and stats.bytes_read > 0


def test_prefetch_continues_below_a_host_node(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(48)
    writer = make_stack(cfg)
    expected = write_prefix(writer, ids, seed=5)
    reader = make_stack(cfg)
    write_prefix(reader, ids[:16], seed=5)  # same bytes for the head: the reader has it
    assert prefetch(reader.cache, "r", ids) == 32
    host_hit, slots = load(reader, ids)
    assert host_hit == 32
    got = kv_of(reader, slots)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want[16:], have[16:])
    reader.cache.check_invariants()


def test_tenants_never_share_pages(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(32)
    writer = make_stack(cfg)
    write_prefix(writer, ids, extra_key="tenant-a")
    reader = make_stack(cfg)
    assert prefetch(reader.cache, "b", ids, extra_key="tenant-b") == 0
    assert prefetch(reader.cache, "none", ids) == 0
    assert prefetch(reader.cache, "a", ids, extra_key="tenant-a") == 32
    reader.cache.check_invariants()


def test_changed_fingerprint_misses(tmp_path):
    ids = random_ids(32)
    write_prefix(make_stack(storage_config(tmp_path)), ids)
    other_model = make_stack(storage_config(tmp_path, model_revision="r2"))
    assert prefetch(other_model.cache, "r", ids) == 0
    other_layout = make_stack(storage_config(tmp_path), layout="layer_first")
    assert prefetch(other_layout.cache, "r", ids) == 0
    same = make_stack(storage_config(tmp_path))
    assert prefetch(same.cache, "r", ids) == 32


def test_missing_middle_page_loads_only_the_head(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(32)
    write_prefix(make_stack(cfg), ids)
    victim = sorted((tmp_path).rglob("*.bin"))
    reader = make_stack(cfg)
    keys = reader.cache.storage_tier.keys
    import numpy as np

    from hicache.radix.page_hash import namespace_seed, page_hashes

    third = keys.page_keys(page_hashes(np.asarray(ids, np.int32), PAGE, namespace_seed(None)))[2]
    removed = [p for p in victim if p.name.startswith(third)]
    assert removed
    for p in removed:
        p.unlink()
    assert prefetch(reader.cache, "r", ids) == 2 * PAGE
    reader.cache.check_invariants()


def test_write_back_still_stores_head_pages(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(32)
    writer = make_stack(cfg, write_policy="write_back")
    slots = writer.allocator.alloc(32)
    writer.cache.insert(RadixKey(ids), slots)
    branch = torch.cat([slots[:16], writer.allocator.alloc(16)])  # shares the first 16
    writer.cache.insert(RadixKey(ids[:16] + random_ids(16, seed=9)), branch)
    writer.cache.evict(10_000)  # write_back: everything goes to the host, then storage
    writer.cache.drain_transfers()
    reader = make_stack(cfg)
    assert prefetch(reader.cache, "r", ids) == 32
    assert prefetch(reader.cache, "s", ids[:16] + random_ids(16, seed=9)) == 16


class GatedStorage(MemoryStorage):
    """A memory backend whose reads and writes wait for ``gate`` (a test's hand on the I/O
    thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        self.gate.wait(10)
        return super().batch_get_v1(keys, host_indices, extra_info)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        self.gate.wait(10)
        return super().batch_set_v1(keys, host_indices, extra_info)


def test_host_copy_pinned_until_storage_acknowledges():
    backend = GatedStorage()
    stack = make_stack(storage_config(backend))
    cache = stack.cache
    ids = random_ids(32)
    cache.insert(RadixKey(ids), stack.allocator.alloc(32))
    cache.host_tier.drain()  # the host write lands; the storage write waits at the gate
    cache.evict(10_000)  # device copy gone: a host-only node
    assert cache.evict_host(10_000) == 0  # pinned by the storage write in flight
    assert cache.stats().storage.pending_backups == 1
    cache.check_invariants()
    backend.gate.set()
    cache.drain_transfers()
    assert cache.stats().storage.pending_backups == 0
    assert cache.evict_host(10_000) == 32
    cache.check_invariants()


@pytest.mark.parametrize("policy", ["best_effort", "timeout", "wait_complete"])
def test_policies_release_everything(tmp_path, policy):
    cfg = storage_config(tmp_path)
    ids = random_ids(64)
    write_prefix(make_stack(cfg), ids)
    reader = make_stack(
        storage_config(
            tmp_path,
            prefetch_policy=policy,
            prefetch_timeout_base=0.0,
            prefetch_timeout_per_ki_token=0.0,
        )
    )
    cache = reader.cache
    m = cache.match_prefix(RadixKey(ids))
    assert cache.prefetch_from_storage("r", m.last_host_node, RadixKey(ids))
    if policy == "wait_complete":
        cache.drain_transfers()  # everything lands; only then may it go
    assert cache.check_prefetch_progress("r")
    loaded = cache.pop_prefetch_loaded_tokens("r")
    assert loaded in range(0, 65, PAGE)
    if policy == "wait_complete":
        assert loaded == 64
    cache.drain_transfers()
    cache.check_invariants()  # no reserved host slot left behind
    assert cache.host_tier.reserved() == 0


def test_abort_and_reset_release_reserved_slots(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(64)
    write_prefix(make_stack(cfg), ids)
    reader = make_stack(cfg)
    cache = reader.cache
    for rid in ("a", "b"):
        m = cache.match_prefix(RadixKey(ids))
        assert cache.prefetch_from_storage(rid, m.last_host_node, RadixKey(ids))
    cache.release_aborted_request("a")
    cache.release_aborted_request("unknown")  # a no-op
    cache.reset()
    assert cache.host_tier.reserved() == 0
    cache.check_invariants()
    assert cache.check_prefetch_progress("b")  # forgotten by reset


def test_slower_than_recompute_is_not_loaded(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(32)
    write_prefix(make_stack(cfg), ids)
    reader = make_stack(cfg)
    cache = reader.cache
    cache.storage_tier.cost.note_read(1, 1.0)  # one second a page
    cache.note_prefill(1_000_000, 1.0)  # a million tokens a second
    assert prefetch(cache, "r", ids) == 0
    assert cache.stats().storage.prefetch_skipped_slower == 1
    cache.note_prefill(1, 10.0)  # now recomputing is far slower
    for _ in range(40):
        cache.note_prefill(1, 10.0)
    assert prefetch(cache, "s", ids) == 32


def test_short_miss_and_misuse(tmp_path):
    cache = make_stack(storage_config(tmp_path, prefetch_threshold=16)).cache
    root = cache.tree.root
    assert not cache.prefetch_from_storage("r", root, RadixKey(random_ids(12)))  # under threshold
    with pytest.raises(TypeError, match="req_id"):
        cache.prefetch_from_storage(7, root, RadixKey(random_ids(16)))
    assert cache.prefetch_from_storage("r", root, RadixKey(random_ids(16)))
    with pytest.raises(ValueError, match="already prefetching"):
        cache.prefetch_from_storage("r", root, RadixKey(random_ids(16)))
    with pytest.raises(TypeError, match="req_id"):
        cache.check_prefetch_progress(None)
    with pytest.raises(TypeError, match="tokens"):
        cache.note_prefill("3", 1.0)
    with pytest.raises(ValueError, match="seconds"):
        cache.note_prefill(3, -1.0)
    other = make_stack(storage_config(tmp_path)).cache
    other.insert(RadixKey(random_ids(8), "x"), other.token_to_kv_pool_allocator.alloc(8))
    node = other.match_prefix(RadixKey(random_ids(8), "x")).last_device_node
    with pytest.raises(ValueError):
        cache.prefetch_from_storage("s", node, RadixKey(random_ids(16)))  # not this tree's node
    with pytest.raises(ValueError, match="extra_key"):
        other.prefetch_from_storage("s", node, RadixKey(random_ids(16), "y"))
    cache.drain_transfers()
    cache.check_invariants()


class FailingStorage(MemoryStorage):
    def batch_exists(self, keys, extra_info=None):
        raise OSError("disk on fire")

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        raise OSError("disk on fire")


def test_failing_backend_is_a_miss_and_serving_goes_on():
    stack = make_stack(storage_config(FailingStorage()))
    cache = stack.cache
    ids = random_ids(32)
    write_prefix(stack, ids)  # the storage write fails: logged, counted, not raised
    assert prefetch(cache, "r", random_ids(32, seed=4)) == 0
    stats = cache.stats().storage
    assert stats.failures >= 2 and stats.backup_pages == 0
    assert len(cache.match_prefix(RadixKey(ids)).device_indices) == 32
    cache.evict(10_000)
    assert cache.evict_host(10_000) == 32  # not pinned after the failed write
    cache.check_invariants()


def test_concurrent_prefetches_read_shared_pages_once(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(64)
    writer = make_stack(cfg)
    write_prefix(writer, ids, seed=8)
    page_bytes = writer.cache.stats().storage.bytes_written // (64 // PAGE)
    reader = make_stack(cfg)
    cache = reader.cache
    root = cache.tree.root
    assert cache.prefetch_from_storage("lead", root, RadixKey(ids[:32]))
    assert cache.prefetch_from_storage("follow", root, RadixKey(ids))  # shares the first pages
    assert cache.stats().storage.pending_prefetches == 2
    wait_for(cache, "lead", "follow")
    assert cache.pop_prefetch_loaded_tokens("lead") == 32
    assert cache.pop_prefetch_loaded_tokens("follow") == 32  # only the pages below the lead's
    stats = cache.stats().storage
    assert stats.bytes_read == page_bytes * (64 // PAGE)  # every page read exactly once
    assert stats.hit_pages == 64 // PAGE
    assert load(reader, ids)[0] == 64
    reader.cache.check_invariants()


def test_follower_of_an_aborted_leader_reads_itself(tmp_path):
    cfg = storage_config(tmp_path)
    ids = random_ids(32)
    write_prefix(make_stack(cfg), ids)
    cache = make_stack(cfg).cache
    root = cache.tree.root
    assert cache.prefetch_from_storage("lead", root, RadixKey(ids))
    assert cache.prefetch_from_storage("follow", root, RadixKey(ids))
    cache.release_aborted_request("lead")
    wait_for(cache, "follow")
    assert cache.pop_prefetch_loaded_tokens("follow") == 32
    cache.drain_transfers()
    cache.check_invariants()
    assert cache.host_tier.reserved() == 0


def test_mla_rank0_writes_every_rank_reads_mha_shards_apart(tmp_path):
    ids = random_ids(32)
    rank1 = make_stack(storage_config(tmp_path, tp_rank=1, tp_size=2), mla=True)
    write_prefix(rank1, ids)
    assert rank1.cache.stats().storage.backup_pages == 0  # MLA: only rank 0 writes
    rank0 = make_stack(storage_config(tmp_path, tp_rank=0, tp_size=2), mla=True)
    write_prefix(rank0, ids)
    assert rank0.cache.stats().storage.backup_pages == 32 // PAGE
    reader = make_stack(storage_config(tmp_path, tp_rank=1, tp_size=2), mla=True)
    assert prefetch(reader.cache, "r", ids) == 32  # every rank reads the one latent copy
    mha0 = make_stack(storage_config(tmp_path, tp_rank=0, tp_size=2))
    write_prefix(mha0, ids)
    mha1 = make_stack(storage_config(tmp_path, tp_rank=1, tp_size=2))
    assert prefetch(mha1.cache, "r", ids) == 0  # another rank's heads: not this shard

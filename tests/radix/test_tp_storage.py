"""The storage tier's TP decisions, on one rank of a two-rank group whose peer is scripted
(``tp_peer.PeerGroup``): hit lengths, host slots, stopping, adopted pages, backup unpins."""

from __future__ import annotations

import pytest

from hicache.backends.memory import MemoryStorage
from hicache.radix import RadixKey
from tests.radix.storage_helpers import (
    PAGE,
    fill,
    make_stack,
    prefetch,
    random_ids,
    storage_config,
    write_prefix,
)
from tests.radix.tp_peer import PeerGroup, with_words, zeros_after_status


def _pair(root):
    """A writer and a reader over one file store, both rank 0 of a TP group of two."""
    cfg = storage_config(root)
    writer_tp, reader_tp = PeerGroup(), PeerGroup()
    writer = make_stack(cfg, tp_group=writer_tp)
    reader = make_stack(cfg, tp_group=reader_tp)
    return writer, writer_tp, reader, reader_tp


def _insert_and_back_up(stack, ids, seed):
    """Insert ``ids`` with random KV and let this rank's host and storage writes land (no
    ``drain_transfers``: it would wait for a peer that never finishes)."""
    slots = stack.allocator.alloc(len(ids))
    fill(stack, slots, seed)
    cache = stack.cache
    cache.insert(RadixKey(ids), slots)
    cache.check_hicache_events()  # the host write lands; its storage backup is queued
    cache.storage_tier.io.drain()
    cache.check_hicache_events()


def test_the_reader_loads_only_the_pages_every_rank_has(tmp_path):
    writer, _, reader, tp = _pair(tmp_path)
    ids = random_ids(8 * PAGE, 1)
    write_prefix(writer, ids, seed=1)
    tp.peer["storage prefetch hits"] = with_words(w1=3)  # the peer's store has 3 pages
    assert prefetch(reader.cache, "r", ids) == 3 * PAGE
    reader.cache.check_invariants()


def test_no_rank_reads_when_the_peer_got_no_host_slots(tmp_path):
    writer, _, reader, tp = _pair(tmp_path)
    ids = random_ids(8 * PAGE, 2)
    write_prefix(writer, ids, seed=2)
    free = reader.cache.cache_controller.mem_pool_host.available_size()
    tp.peer["storage prefetch slots"] = zeros_after_status
    assert prefetch(reader.cache, "r", ids) == 0
    reader.cache.drain_transfers()
    assert reader.cache.cache_controller.mem_pool_host.available_size() == free
    assert reader.cache.host_tier.reserved() == 0


def test_a_request_waits_while_the_peer_reads_and_goes_when_its_policy_says(tmp_path):
    writer, _, reader, tp = _pair(tmp_path)
    ids = random_ids(8 * PAGE, 3)
    write_prefix(writer, ids, seed=3)
    cache = reader.cache
    m = cache.match_prefix(RadixKey(ids))
    assert cache.prefetch_from_storage("r", m.last_host_node, RadixKey(ids))
    cache.drain_transfers()  # this rank's query and read are done
    tp.peer["storage prefetch progress"] = with_words(w1=0, w2=2)  # peer: not done, 2 pages
    for _ in range(3):
        assert not cache.check_prefetch_progress("r")  # wait_complete: wait for the peer
    tp.peer["storage prefetch progress"] = with_words(w1=0, w2=2, w3=-1)  # peer: time is up
    assert cache.check_prefetch_progress("r")
    assert cache.pop_prefetch_loaded_tokens("r") == 2 * PAGE  # the pages both ranks read
    cache.drain_transfers()
    assert cache.host_tier.reserved() == 0
    cache.check_invariants()


def test_a_node_stays_pinned_until_the_peer_has_stored_it(tmp_path):
    writer, tp, _, _ = _pair(tmp_path)
    cache = writer.cache
    tp.peer["storage backups"] = with_words(w1=0)  # the peer's backup is still running
    ids = random_ids(4 * PAGE, 4)
    _insert_and_back_up(writer, ids, seed=4)
    assert cache.evict(len(ids)) == len(ids)  # host-only now, but pinned
    assert cache.evict_host(len(ids)) == 0
    del tp.peer["storage backups"]
    cache.check_hicache_events()
    assert cache.evict_host(len(ids)) == len(ids)


def test_a_page_the_peer_failed_to_store_is_written_again(tmp_path):
    def backup_pages(peer_fails: bool) -> int:
        writer, tp, _, _ = _pair(tmp_path / str(peer_fails))
        if peer_fails:
            tp.peer["storage backups"] = lambda w: [*w[:2], -1]  # max(failed) = 1
        ids = random_ids(8 * PAGE, 5)
        write_prefix(writer, ids[: 4 * PAGE], seed=5)
        tp.peer.clear()
        write_prefix(writer, ids, seed=5)
        return writer.cache.stats().storage.backup_pages

    assert backup_pages(peer_fails=False) == 8
    assert backup_pages(peer_fails=True) == 12  # the first node's 4 pages went again


def test_an_mla_rank_that_does_not_write_pins_as_the_writer_does():
    cfg = storage_config(MemoryStorage())
    tp = PeerGroup(rank=1)
    stack = make_stack(cfg, mla=True, tp_group=tp)
    tp.peer["storage backups"] = with_words(w1=0)  # rank 0 is still writing
    ids = random_ids(4 * PAGE, 6)
    _insert_and_back_up(stack, ids, seed=6)
    cache = stack.cache
    assert cache.stats().storage.bytes_written == 0
    assert cache.evict(len(ids)) == len(ids)
    assert cache.evict_host(len(ids)) == 0
    del tp.peer["storage backups"]
    cache.check_hicache_events()
    assert cache.evict_host(len(ids)) == len(ids)


def test_a_storage_shard_that_differs_from_the_group_is_refused(tmp_path):
    cfg = storage_config(tmp_path, tp_rank=1, tp_size=2)
    with pytest.raises(ValueError, match="tp_group"):
        make_stack(cfg, tp_group=PeerGroup(rank=0))
    stack = make_stack(storage_config(tmp_path, tp_rank=0, tp_size=2), tp_group=PeerGroup())
    ids = random_ids(4 * PAGE, 7)
    write_prefix(stack, ids, seed=7)
    assert stack.cache.stats().storage.backup_pages == 4

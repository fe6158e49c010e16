"""HybridHiRadixCache: a hybrid model's SWA KV and recurrent states through the host tier."""

from __future__ import annotations

import pytest
import torch

from hicache.backends import MemoryStorage, StorageConfig
from hicache.radix import HiCacheConfig, RadixKey
from hicache.radix.components import host_state_of, host_swa_gone, is_tombstoned
from tests.radix.hybrid_host_rig import HybridHostRig

PATTERNS = ["FSL", "FL", "FS", "SL"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_host_hit_restores_kv_and_state(pattern: str, page_size: int) -> None:
    rig = HybridHostRig(pattern, page_size=page_size, load_back_threshold=0)
    ids = list(range(1, 4 * page_size + 1))
    _, kv, value = rig.put(ids)
    rig.evict_all()
    match = rig.cache.match_prefix(RadixKey(ids))
    assert (match.device_prefix_len, match.host_hit_length) == (0, len(ids))
    for layer in rig.attention_layers():  # poison what the load will overwrite
        rig.pools.kv.get_key_buffer(layer).fill_(-7)
    _, slots, node = rig.load(ids)
    assert slots.numel() == len(ids) and node is match.last_host_node
    for layer, keys in kv.items():
        torch.testing.assert_close(rig.read_keys(layer, slots), keys, rtol=0, atol=0)
    if "L" in pattern:
        state = rig.cache.device_state(node)
        assert state is not None and rig.state_value(state) == pytest.approx(value, rel=1e-2)
    assert rig.cache.match_prefix(RadixKey(ids)).device_prefix_len == len(ids)
    rig.check()


def test_device_eviction_frees_the_device_state_and_keeps_the_host_one() -> None:
    rig = HybridHostRig("FSL", load_back_threshold=0)
    free = rig.state_pool.available_size()
    rig.put([1, 2, 3, 4])
    assert rig.state_pool.available_size() == free - 1
    rig.evict_all()
    assert rig.state_pool.available_size() == free
    node = rig.cache.match_prefix(RadixKey([1, 2, 3, 4])).last_host_node
    assert host_state_of(node.comp) is not None
    stats = rig.cache.stats().host_components
    assert stats is not None and (stats.host_states_held, stats.states_backed_up) == (1, 1)
    rig.check()


def test_a_node_tombstoned_before_its_backup_comes_back_tombstoned() -> None:
    rig = HybridHostRig("FS", window=4, write_policy="write_back", load_back_threshold=0)
    rig.put([1, 2, 3, 4])
    rig.put([1, 2, 3, 4, 5, 6, 7, 8])
    lower = rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8])).last_device_node
    upper = lower.parent  # as recently used as the lower node: the older id goes first
    assert rig.cache.evict_swa(4) == 4 and is_tombstoned(upper.comp)
    rig.evict_all()  # write-back: both move down, the upper one without SWA KV
    assert upper.slots is None and upper.comp.host_swa_gone
    match = rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8]))
    assert match.host_hit_length == 8  # the window (4) lies in the lower node
    _, slots, node = rig.load([1, 2, 3, 4, 5, 6, 7, 8])
    assert slots.numel() == 8 and is_tombstoned(upper.comp) and not is_tombstoned(node.comp)
    assert rig.cache.match_prefix(RadixKey([1, 2, 3, 4])).device_prefix_len == 0
    rig.check()


def test_a_split_of_a_node_being_written_keeps_its_swa_kv_until_the_write_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = HybridHostRig("FS", window=4, load_back_threshold=0)
    ctrl = rig.cache.cache_controller
    issue = ctrl.start_writing
    monkeypatch.setattr(ctrl, "start_writing", lambda: None)  # the backup stays queued
    ids = list(range(1, 9))
    _, kv, _ = rig.put(ids)
    lower = rig.cache.match_prefix(RadixKey(ids)).last_device_node
    upper = rig.cache.match_prefix(RadixKey(ids[:4])).last_device_node  # splits it
    assert upper is lower.parent and ctrl.write_queue
    assert rig.cache.evict_swa(8) == 0  # the queued write still reads both halves' SWA KV
    monkeypatch.setattr(ctrl, "start_writing", issue)
    rig.evict_all()
    _, slots, node = rig.load(ids[:4])
    assert node is upper and slots.numel() == 4 and not host_swa_gone(upper.comp)
    for layer, keys in kv.items():  # the SWA layer's host copy is the one written
        torch.testing.assert_close(rig.read_keys(layer, slots), keys[:4], rtol=0, atol=0)
    rig.check()


def _revive_under_a_queued_write(rig: HybridHostRig, ids: list[int]) -> dict[int, torch.Tensor]:
    """Cache ``ids`` (``ids[:8]`` tombstoned), queue their backups (kept queued) and finish a
    request that recomputed ``ids[:8]``: the node takes its slots. The KV first written."""
    cache = rig.cache
    _, kv, _ = rig.put(ids[:8])
    assert cache.evict_swa(8) == 8  # tombstoned before its backup is queued
    rig.put(ids)  # a live leaf below it: a usable host prefix later
    cache.cache_controller.start_writing = lambda: None  # type: ignore[method-assign]
    for _ in range(3):  # the third hit queues the backups
        cache.match_prefix(RadixKey(ids))
    req, own = rig.recompute(ids[:8])
    cache.cache_finished_req(req)
    node = cache.match_prefix(RadixKey(ids[:8])).last_device_node
    assert node.slots.tolist() == own.tolist() and not is_tombstoned(node.comp)
    del cache.cache_controller.start_writing  # the class's again
    return kv


def test_a_revived_node_keeps_its_old_slots_until_its_queued_write_lands() -> None:
    rig = HybridHostRig("FS", load_back_threshold=0, write_policy="write_through_selective")
    allocator, ids = rig.pools.allocator, list(range(1, 13))
    free = allocator.available_size()
    kv = _revive_under_a_queued_write(rig, ids)
    assert allocator.available_size() == free - 20  # the queued write reads the old 8
    held = rig.cache.host_tier.held()
    owned = torch.cat([n.value.cpu() for n in rig.cache.tree.nodes() if n.value is not None])
    assert held.numel() == 8 and not torch.isin(held, owned).any()  # allocated, no node's
    reuse = allocator.alloc(allocator.available_size())
    rig.write_kv(reuse)  # every free slot taken and overwritten
    allocator.free(reuse)
    rig.evict_all()  # the write lands: the old slots go back
    assert allocator.available_size() == free and not rig.cache.host_tier.held().numel()
    _, slots, _ = rig.load(ids)
    assert slots.numel() == 12  # the full layer's host copy is the one first written
    torch.testing.assert_close(rig.read_keys(0, slots[:8]), kv[0], rtol=0, atol=0)
    rig.check()


def test_a_reset_frees_the_old_slots_a_queued_write_read() -> None:
    rig = HybridHostRig("FS", load_back_threshold=0, write_policy="write_through_selective")
    free = rig.pools.allocator.available_size()
    _revive_under_a_queued_write(rig, list(range(1, 13)))
    rig.cache.reset()
    assert rig.pools.allocator.available_size() == free
    rig.check()


def test_host_state_lru_frees_the_oldest_and_the_match_stops_above() -> None:
    rig = HybridHostRig("FL", load_back_threshold=0, host_state_slots=2)
    rig.put([1, 2])
    rig.put([1, 2, 3, 4])
    rig.put([9, 8])  # a third host state: the host state pool (2 slots) evicts the oldest
    rig.evict_all()
    assert rig.cache.stats().host_components.host_states_evicted >= 1
    match = rig.cache.match_prefix(RadixKey([1, 2, 3, 4]))
    assert match.host_hit_length in (2, 4)
    rig.check()


def test_load_back_returns_the_device_gap_between_usable_prefix_and_chain() -> None:
    rig = HybridHostRig("FL", load_back_threshold=0)
    rig.put([1, 2])
    rig.put([1, 2, 3, 4, 5, 6])
    lower = rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6])).last_device_node
    rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 9, 9]))  # splits: 3..4 without a state
    rig.cache.drain_transfers()
    rig.cache.evict(2)  # only the leaf 5..6 leaves the device
    assert lower.slots is None
    match, slots, node = rig.load([1, 2, 3, 4, 5, 6])
    assert match.device_prefix_len == 2 and match.host_hit_length == 4
    assert node is lower and slots.numel() == 4
    assert torch.equal(slots[:2], torch.as_tensor(lower.parent.slots))
    rig.check()


def test_settings_a_hybrid_host_tier_does_not_take() -> None:
    with pytest.raises(ValueError, match="inclusive"):
        HybridHostRig("FSL", tiering="exclusive")
    exclusive = StorageConfig(backend="memory", tiering="exclusive")
    with pytest.raises(ValueError, match="storage tier is inclusive only"):
        HybridHostRig("FSL", config=HiCacheConfig(storage=exclusive))
    with pytest.raises(ValueError, match="a backend by name"):
        HybridHostRig("FSL", config=HiCacheConfig(storage=StorageConfig(backend=MemoryStorage())))


def test_events_name_the_component_and_the_medium() -> None:
    rig = HybridHostRig("FSL", page_size=4, enable_kv_events=True, load_back_threshold=0)
    rig.put(list(range(1, 9)))
    stored = {(type(e).__name__, e.component, e.medium) for e in rig.cache.take_events()}
    assert ("BlockStored", "mamba", "GPU") in stored
    assert ("BlockStored", "mamba", "CPU_PINNED") in stored
    assert ("BlockStored", "full", "CPU_PINNED") in stored
    rig.evict_all()
    gone = {(type(e).__name__, e.component, e.medium) for e in rig.cache.take_events()}
    assert gone == {("BlockRemoved", "full", "GPU"), ("BlockRemoved", "mamba", "GPU")}
    rig.cache.evict_host(8)  # the node leaves the tree: its host KV and host state go
    gone = {(type(e).__name__, e.component, e.medium) for e in rig.cache.take_events()}
    assert gone == {("BlockRemoved", "full", "CPU_PINNED"), ("BlockRemoved", "mamba", "CPU_PINNED")}


def test_a_load_short_of_swa_slots_tombstones_instead_of_evicting_full_kv() -> None:
    rig = HybridHostRig("FS", swa_pages=8, load_back_threshold=0)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12]
    rig.put(a)
    rig.evict_all()
    rig.put(b)  # the SWA pool (8) is full now
    assert rig.pools.allocator.swa_available_size() == 0
    _, slots, _ = rig.load(a)
    assert slots.numel() == 4
    other = rig.cache.match_prefix(RadixKey(b)).full_kv_node
    assert other.slots is not None and is_tombstoned(other.comp)  # full KV kept on the device
    rig.check()


@pytest.mark.parametrize(
    ("settings", "error", "words"),
    [
        ({"host_state_slots": 0}, ValueError, "host_state_slots"),
        ({"host_state_slots": 1.5}, TypeError, "host_state_slots"),
        ({"host_states": "pool"}, TypeError, "host_states must be a MambaPoolHost"),
    ],
)
def test_bad_host_state_settings_raise_naming_them(settings, error, words) -> None:
    with pytest.raises(error, match=words):
        HybridHostRig("FSL", **settings)


def test_bad_load_back_arguments_raise_before_any_change() -> None:
    rig = HybridHostRig("FSL", load_back_threshold=0)
    rig.put([1, 2, 3, 4])
    rig.evict_all()
    node = rig.cache.match_prefix(RadixKey([1, 2, 3, 4])).last_host_node
    before = (rig.cache.stats(), rig.pools.allocator.available_size())
    for args, error in [
        (("node", 4), TypeError),
        ((node, -1), ValueError),
        ((node, 4, -2), ValueError),
        ((node, "4"), TypeError),
    ]:
        with pytest.raises(error):
            rig.cache.init_load_back(*args)
    assert (rig.cache.stats(), rig.pools.allocator.available_size()) == before
    assert node.slots is None
    rig.check()


@pytest.mark.parametrize("verify", ["all", "sample"])
def test_a_corrupt_host_state_is_never_served(verify: str) -> None:
    rig = HybridHostRig("FSL", verify=verify, load_back_threshold=0)
    ids = [1, 2, 3, 4]
    rig.put(ids)
    rig.evict_all()
    node = rig.cache.match_prefix(RadixKey(ids)).last_host_node
    row = rig.cache.host_components.host_states.page_bytes(host_state_of(node.comp))
    row[0] ^= 0xFF  # one flipped byte while the state sits in host memory
    match, slots, last = rig.load(ids)
    assert match.host_hit_length == 4 and slots.numel() == 0 and last is rig.cache.root
    stats = rig.cache.stats().host_components
    assert stats.state_integrity_failures == 1 and stats.states_loaded == 0
    assert host_state_of(node.comp) is None and rig.cache.device_state(node) is None
    rig.check()


def test_a_clean_host_state_passes_verify() -> None:
    rig = HybridHostRig("FSL", verify="all", load_back_threshold=0)
    _, _, value = rig.put([1, 2, 3, 4])
    rig.evict_all()
    _, slots, node = rig.load([1, 2, 3, 4])
    state = rig.cache.device_state(node)
    assert slots.numel() == 4 and state is not None
    assert rig.state_value(state) == pytest.approx(value, rel=1e-2)
    assert rig.cache.stats().host_components.state_integrity_failures == 0
    rig.check()

"""A hybrid model's components through the storage tier: pages of every attention layer, SWA
validity (a chain break), recurrent states beside the pages, fingerprints, misuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hicache.backends import MemoryStorage, StorageConfig
from hicache.backends.composite_pages import CompositePageIO, StatePageIO, page_io_of
from hicache.metric_rows import rows
from hicache.radix import HiCacheConfig, RadixKey
from hicache.radix.components import host_state_of, host_swa_gone, is_tombstoned
from tests.radix.hybrid_host_rig import HybridHostRig
from tests.radix.storage_helpers import prefetch


def _rig(
    root: Path, pattern: str, page_size: int = 1, events: bool = False, **settings: Any
) -> HybridHostRig:
    """A hybrid rig whose storage tier is a file store under ``root`` (``settings``: the
    ``HiCacheConfig``'s; ``events``: KV events on)."""
    storage = StorageConfig(
        backend="file",
        extra_config={"root": str(root)},
        model_id="test/hybrid",
        prefetch_threshold=page_size,
        prefetch_policy="wait_complete",
    )
    config = HiCacheConfig(storage=storage, load_back_threshold=0, **settings)
    return HybridHostRig(pattern, page_size=page_size, config=config, enable_kv_events=events)


def _poison(rig: HybridHostRig) -> None:
    """Every KV and state byte a load will overwrite, set to -7 (unwritten bytes show)."""
    for layer in rig.attention_layers():
        rig.pools.kv.get_key_buffer(layer).fill_(-7)
    if rig.cache.hybrid.recurrent:
        for tensor in rig.state_pool.mamba_cache.tensors():
            tensor.fill_(-7)


def _storage_state_events(rig: HybridHostRig) -> dict[str, float]:
    """The ``recurrent_state_events`` metric samples of the storage tier, by event."""
    samples = rows(rig.cache.stats())
    return {
        labels["event"]: value
        for name, _, _, labels, value in samples
        if name == "recurrent_state_events" and labels.get("tier") == "storage"
    }


@pytest.mark.parametrize("pattern", ["FSL", "FL", "FS", "SL"])
@pytest.mark.parametrize(("page_size", "layout"), [(1, "layer_first"), (4, "page_first")])
def test_storage_round_trip_restores_kv_and_state(
    tmp_path: Path, pattern: str, page_size: int, layout: str
) -> None:
    ids = list(range(1, 4 * page_size + 1))
    writer = _rig(tmp_path, pattern, page_size, mem_layout=layout)
    _, kv, value = writer.put(ids)
    writer.cache.drain_transfers()
    recurrent = "L" in pattern
    stats = writer.cache.stats()
    assert stats.storage.backup_pages == 4
    assert stats.host_components.states_stored == int(recurrent)
    reader = _rig(tmp_path, pattern, page_size, mem_layout=layout)
    _poison(reader)
    assert prefetch(reader.cache, "r", ids) == len(ids)
    host_node = reader.cache.match_prefix(RadixKey(ids)).last_host_node
    assert not host_swa_gone(host_node.comp)
    assert (host_state_of(host_node.comp) is not None) == recurrent
    match, slots, node = reader.load(ids)
    assert match.host_hit_length == len(ids) and slots.numel() == len(ids)
    for layer, keys in kv.items():
        torch.testing.assert_close(reader.read_keys(layer, slots), keys, rtol=0, atol=0)
    if recurrent:
        state = reader.cache.device_state(node)
        assert state is not None and reader.state_value(state) == pytest.approx(value, rel=1e-2)
        assert _storage_state_events(reader) == {"stored": 0, "loaded": 1}
        assert _storage_state_events(writer) == {"stored": 1, "loaded": 0}
    reader.check()
    writer.cache.close()
    reader.cache.close()


def test_a_swa_gone_node_stops_the_chain(tmp_path: Path) -> None:
    writer = _rig(tmp_path, "FS", write_policy="write_back")
    writer.put([1, 2, 3, 4])
    writer.put([1, 2, 3, 4, 5, 6, 7, 8])
    lower = writer.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8])).last_device_node
    upper = lower.parent
    assert writer.cache.evict_swa(4) == 4 and is_tombstoned(upper.comp)
    writer.evict_all()  # write-back: both to the host, the upper one with its SWA KV gone
    writer.cache.drain_transfers()
    assert upper.comp.host_swa_gone
    assert writer.cache.stats().storage.backup_pages == 0  # nor the lower one, below it
    reader = _rig(tmp_path, "FS")
    assert prefetch(reader.cache, "r", [1, 2, 3, 4, 5, 6, 7, 8]) == 0
    writer.check()


def test_pages_past_the_last_state_are_not_adopted(tmp_path: Path) -> None:
    writer = _rig(tmp_path, "FL")
    head, _, _ = writer.put([1, 2, 3, 4])
    slots = writer.pools.allocator.alloc(4)
    writer.write_kv(slots)
    writer.cache.insert(RadixKey([1, 2, 3, 4, 5, 6, 7, 8]), torch.cat([head, slots]))
    writer.cache.drain_transfers()
    assert writer.cache.stats().storage.backup_pages == 8  # every page, one state (at 4)
    reader = _rig(tmp_path, "FL")
    assert prefetch(reader.cache, "r", [1, 2, 3, 4, 5, 6, 7, 8]) == 4
    match = reader.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8]))
    assert match.host_hit_length == 4
    reader.check()


def test_a_state_gained_after_its_pages_follows_them(tmp_path: Path) -> None:
    writer = _rig(tmp_path, "FL")
    slots = writer.pools.allocator.alloc(4)
    writer.write_kv(slots)
    writer.cache.insert(RadixKey([1, 2, 3, 4]), slots)  # no state: its pages go alone
    writer.cache.drain_transfers()
    state = int(writer.state_pool.alloc(1)[0])
    writer.cache.insert(RadixKey([1, 2, 3, 4]), slots, state=state)  # the state comes later
    writer.cache.drain_transfers()
    assert writer.cache.stats().host_components.states_stored == 1
    reader = _rig(tmp_path, "FL")
    assert prefetch(reader.cache, "r", [1, 2, 3, 4]) == 4
    reader.check()


def test_another_pattern_or_state_shape_never_reads_the_objects(tmp_path: Path) -> None:
    writer = _rig(tmp_path, "FSL")
    writer.put([1, 2, 3, 4])
    writer.cache.drain_transfers()
    assert prefetch(_rig(tmp_path, "FLS").cache, "r", [1, 2, 3, 4]) == 0
    assert prefetch(_rig(tmp_path, "FSL").cache, "r", [1, 2, 3, 4]) == 4
    keys = writer.cache.storage_tier.keys
    states = writer.cache.storage_tier.states
    assert keys.fingerprint.pattern and states is not None
    assert states.keys.fingerprint.digest != keys.fingerprint.digest


def test_misuse(tmp_path: Path) -> None:
    rig = _rig(tmp_path, "FSL")
    host_pool = rig.cache.cache_controller.mem_pool_host
    pages = page_io_of(host_pool)
    assert isinstance(pages, CompositePageIO) and pages.parts == 1
    with pytest.raises(ValueError, match="one row per host page"):
        pages.attach_checksums(torch.zeros((1, 1), dtype=torch.int64))
    states = page_io_of(rig.cache.host_components.host_states)
    assert isinstance(states, StatePageIO) and states.page_size == 1
    with pytest.raises(IndexError, match="host_indices"):
        states.page_slots(["k"], torch.tensor([states.slot_limit], dtype=torch.int64))
    with pytest.raises(TypeError, match="HybridKVPoolHost or MambaPoolHost"):
        MemoryStorage().register_mem_pool_host(object())
    instance = StorageConfig(backend=MemoryStorage())
    with pytest.raises(ValueError, match="a backend by name"):
        HybridHostRig("FL", config=HiCacheConfig(storage=instance))
    memory = HybridHostRig("FS", config=HiCacheConfig(storage=instance))  # no states: fine
    assert memory.cache.storage_tier.states is None


def test_storage_events_name_the_mamba_component(tmp_path: Path) -> None:
    writer = _rig(tmp_path, "FL", events=True)
    writer.put([1, 2, 3, 4])
    writer.cache.drain_transfers()
    disk = [e for e in writer.cache.take_events() if getattr(e, "medium", None) == "DISK"]
    assert [e.component for e in disk] == ["full"] * 4 + ["mamba"]  # the state after its pages
    assert disk[-1].block_hashes == disk[3].block_hashes  # keyed by the page ending the node
    reader = _rig(tmp_path, "FL", events=True)
    assert prefetch(reader.cache, "r", [1, 2, 3, 4]) == 4
    host = [e for e in reader.cache.take_events() if getattr(e, "medium", None) == "CPU_PINNED"]
    assert [e.component for e in host] == ["full"] * 4 + ["mamba"]

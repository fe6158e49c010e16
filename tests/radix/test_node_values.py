"""TreeNode and the tree's private slot storage: values are tensors owned by the tree, keys may
view the caller's key, and the slot helpers behind them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.devices import host_copy, known_host_copy, to_device
from hicache.radix import RadixCache, RadixKey, TreeNode
from hicache.radix.invariants import iter_nodes
from hicache.radix.slots import as_tensor, concat_slots, copy_slots


def pure(page_size: int = 1) -> RadixCache:
    return RadixCache(None, None, page_size)


def test_insert_keeps_its_own_int64_copy():
    cache = pure()
    value = torch.tensor([7, 8, 9], dtype=torch.int32)
    cache.insert([1, 2, 3], value)
    value[:] = 0
    stored = cache.match_prefix([1, 2, 3]).device_indices
    assert stored.dtype == torch.int64 and stored.tolist() == [7, 8, 9]
    node = cache.match_prefix([1, 2, 3]).last_device_node
    assert node.value.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()


def test_node_values_are_tensors_that_share_no_memory_with_the_callers():
    cache = pure()
    value = torch.tensor([7, 8, 9])
    cache.insert([1, 2, 3], value)
    node = cache.match_prefix([1, 2, 3]).last_device_node
    assert isinstance(node.value, torch.Tensor) and node.value.dtype == torch.int64
    assert torch.equal(node.value, value) and node.value.device == value.device
    assert not np.shares_memory(node.value.numpy(), value.numpy())
    assert node.host_value is None and node.value.data_ptr() == node.value.data_ptr()
    clone = node.value.clone()
    clone[0] = 0
    assert node.value.tolist() == [7, 8, 9]


def test_node_value_setter_stores_without_copying():

    node = TreeNode(np.array([1, 2], np.int32), None, None)
    slots = torch.tensor([4, 5])
    node.value, node.host_value = slots, slots.numpy()
    assert isinstance(node.slots, np.ndarray) and np.shares_memory(node.slots, slots.numpy())
    assert node.value.data_ptr() == slots.data_ptr() == node.host_value.data_ptr()
    node.value = None
    assert node.evicted and node.slots is None and node.backuped
    with pytest.raises(TypeError, match="slots must be"):
        node.host_value = [4, 5]


def test_leaf_keys_view_the_callers_key_only_when_covering_half_of_it():
    cache = pure(2)
    key = RadixKey(list(range(8)))
    cache.insert(key[:4])  # 4 of the 8 tokens: a view
    cache.insert(key)  # the new tail 4..7, half of the buffer: a view
    cache.insert([0, 1, 2, 3, 9, 9])  # the new tail [9, 9], a third of its buffer: a copy
    cache.match_prefix([0, 1])  # splits [0..3]: each half is a quarter of the buffer, copies
    cache.check_invariants()  # includes: no key pins more than twice its bytes
    views = {
        tuple(n.key.tolist()): np.shares_memory(n.key, key.token_ids) for n in iter_nodes(cache)
    }
    assert views == {(0, 1): False, (2, 3): False, (4, 5, 6, 7): True, (9, 9): False}


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_slot_helpers_copy_and_concatenate(device):
    # meta tensors cannot be read: a device tensor's slots come from the copy it carries
    value = to_device(torch.arange(6, dtype=torch.int32), torch.device(device))
    part = as_tensor(copy_slots(value, 2, 5))
    assert part.dtype == torch.int64 and part.shape == (3,) and part.device.type == "cpu"
    assert part.tolist() == [2, 3, 4] and isinstance(copy_slots(value), np.ndarray)
    joined = concat_slots([part, copy_slots(part)], torch.device(device))
    assert joined.dtype == torch.int64 and joined.shape == (6,) and joined.device.type == device
    assert host_copy(joined).tolist() == [2, 3, 4, 2, 3, 4]
    assert host_copy(concat_slots([], torch.device(device))).shape == (0,)
    if device == "cpu":
        value[2] = 99
        assert part[0] == 2  # a copy, not a view


def test_device_slots_without_a_host_copy_are_read_from_the_device():
    with pytest.raises(NotImplementedError, match="meta"):  # meta: the read is refused
        copy_slots(torch.arange(4, device="meta"))
    assert known_host_copy(torch.arange(4, device="meta")) is None


def test_tree_node_flags_and_ids():

    a = TreeNode(np.array([1], np.int32), torch.tensor([5]), None, tick=3, priority=2)
    b = TreeNode(np.array([1], np.int32), None, a)
    assert not a.evicted and b.evicted and not a.backuped
    b.host_value = torch.tensor([0])
    assert b.backuped and b.id != a.id
    assert (a.creation_time, a.last_access_time, a.priority, a.hit_count) == (3, 3, 2, 0)
    assert "evicted=True" in repr(b)

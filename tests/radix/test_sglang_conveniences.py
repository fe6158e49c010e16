"""SGLang's convenience surface on hicache's own objects: node defaults and ids, the
allocator check (strict for a real allocator, lenient for a test double), the log line and
the flattened values."""

from __future__ import annotations

import unittest.mock

import pytest
import torch

from hicache.pools import TokenToKVPoolAllocator
from hicache.radix import RadixCache, TreeNode


def test_tree_node_defaults_and_unique_ids() -> None:
    node, other = TreeNode(), TreeNode()
    assert other.id == node.id + 1
    assert node.parent is None and node.value is None and len(node.key) == 0
    assert not node.children and node.lock_ref == 0


def test_real_allocator_page_size_mismatch_still_raises() -> None:
    allocator = TokenToKVPoolAllocator(16, page_size=2)
    with pytest.raises(ValueError, match="page_size=4 differs"):
        RadixCache(None, allocator, page_size=4)


def test_mock_allocator_is_accepted_and_freed_to() -> None:
    allocator = unittest.mock.Mock()  # page_size, device and size are Mock attributes
    allocator.available_size.return_value = 5
    cache = RadixCache(None, allocator, page_size=2)
    assert cache.device == torch.device("cpu")
    cache.insert([1, 2, 3, 4], torch.tensor([8, 9, 10, 11]))
    assert cache.available_and_evictable_str() == (
        "Available tokens: 9 (available_size=5 + evictable_size=4)\n"
    )
    assert cache.evict(4) == 4
    freed = torch.cat([c.args[0] for c in allocator.free.call_args_list])
    assert sorted(freed.tolist()) == [8, 9, 10, 11]


def test_all_values_flatten_covers_every_node() -> None:
    cache = RadixCache(None, None, page_size=1)
    assert cache.all_values_flatten().tolist() == []
    cache.insert([1, 2, 3], torch.tensor([10, 20, 30]))
    cache.insert([1, 2, 7], torch.tensor([40, 50, 60]))  # splits [1, 2, 3]
    values = cache.all_values_flatten()
    assert values.dtype == torch.int64 and sorted(values.tolist()) == [10, 20, 30, 60]
    assert cache.available_and_evictable_str().startswith("Available tokens: 4 ")

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hicache.radix import TreeNode


@pytest.fixture(autouse=True)
def _fresh_node_counter() -> Iterator[None]:
    """Upstream's ``setUp``: node ids count from 0 in every test. The process-wide counter is
    put back afterwards, so nodes built by later tests keep unique ids."""
    saved = TreeNode.counter
    TreeNode.counter = 0
    yield
    TreeNode.counter = max(saved, TreeNode.counter)

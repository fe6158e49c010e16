"""SGLang's RadixCache unit tests, part 1 (RadixKey, TreeNode): sglang 0.5.9's
``test/registered/unit/mem_cache/test_radix_cache_unit.py`` ported to hicache: same test
names, same scenarios, our code (part 2, the cache: ``test_upstream_cache.py``).

Call shapes go through ``adapter`` (parameter objects, ``create_simulated``). Tests of features
newer than 0.5.9 or needing CUDA are skipped with the reason; where hicache deliberately
differs (README, "Differences from SGLang") the upstream
check is kept and marked ``xfail(strict=True)`` with the exact failure it meets, so a change of
behaviour on either side shows up.
"""

from __future__ import annotations

import pytest
import torch

from hicache.radix import RadixKey, TreeNode
from tests.sglang_compat.markers import NEWER

NODE_IDS = pytest.mark.xfail(
    strict=True,
    raises=(TypeError, AssertionError),  # TreeNode(id=...) / ids that do not restart at 0
    reason="node ids are unique in the process (leaf sets key on them, eviction ties break by "
    "them): no TreeNode(id=...), and TreeNode.counter cannot reset them",
)
TOKEN_IDS_ARRAY = pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="token_ids is an int32 numpy array, not a list: `array == list` is elementwise",
)


class TestRadixKey:
    @TOKEN_IDS_ARRAY
    def test_init_basic(self) -> None:
        key = RadixKey([1, 2, 3, 4])
        assert key.token_ids == [1, 2, 3, 4]
        assert key.extra_key is None

    @TOKEN_IDS_ARRAY
    def test_init_with_extra_key(self) -> None:
        key = RadixKey([1, 2, 3], "test_key")
        assert key.token_ids == [1, 2, 3]
        assert key.extra_key == "test_key"

    def test_len(self) -> None:
        assert len(RadixKey([1, 2, 3])) == 3
        assert len(RadixKey([])) == 0

    def test_iter(self) -> None:
        assert list(RadixKey([1, 2, 3, 4])) == [1, 2, 3, 4]

    @pytest.mark.parametrize("tokens", [[1, 2, 3], [], [42]])
    def test_len_and_iter(self, tokens: list[int]) -> None:
        key = RadixKey(tokens)
        assert len(key) == len(tokens) and list(key) == tokens

    @pytest.mark.parametrize(("index", "expected"), [(0, [10]), (-1, [30]), (2, [30])])
    def test_getitem_int(self, index: int, expected: list[int]) -> None:
        result = RadixKey([10, 20, 30])[index]
        assert isinstance(result, RadixKey)
        assert result.token_ids == expected  # one element: numpy's answer is truthy

    @TOKEN_IDS_ARRAY
    def test_getitem_slice(self) -> None:
        key = RadixKey([1, 2, 3, 4, 5], "extra")
        sliced = key[1:4]
        assert isinstance(sliced, RadixKey) and sliced.extra_key == "extra"
        assert sliced.token_ids == [2, 3, 4]
        assert key[2:2].token_ids == []
        assert key[:].token_ids == [1, 2, 3, 4, 5]

    def test_getitem_invalid_index(self) -> None:
        with pytest.raises(IndexError):
            RadixKey([1, 2, 3])[10]

    def test_repr(self) -> None:
        text = repr(RadixKey([1, 2, 3], "test"))
        assert "RadixKey" in text and "extra_key='test'" in text and "[1, 2, 3]" in text

    def test_repr_long_token_ids(self) -> None:
        assert "..." in repr(RadixKey(list(range(15))))

    @NEWER
    def test_hash_page_includes_extra_key(self) -> None:
        pass


class TestTreeNode:
    @pytest.mark.xfail(
        strict=True,
        raises=AssertionError,
        reason="a detached node's key is an empty int32 array, not None; ids do not restart "
        "(NODE_IDS); no host_ref_counter (test_protect_release_host)",
    )
    def test_init_basic(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(TreeNode, "counter", 0, raising=False)  # upstream's setUp
        node = TreeNode()
        assert len(node.children) == 0 and node.parent is None
        assert node.value is None and node.host_value is None
        assert node.lock_ref == 0 and node.hit_count == 0
        assert node.key is None
        assert node.id == 0

    @NODE_IDS
    def test_init_with_id(self) -> None:
        assert TreeNode(id=42).id == 42  # type: ignore[call-arg]

    @NODE_IDS
    def test_counter_increment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(TreeNode, "counter", 0, raising=False)  # upstream's setUp
        assert [TreeNode().id, TreeNode().id] == [0, 1]

    def test_ids_count_up_uniquely(self) -> None:  # ours: what test_counter_increment keeps
        first, second = TreeNode(), TreeNode()
        assert second.id == first.id + 1

    @pytest.mark.parametrize(
        ("has_value", "has_host_value", "evicted", "backuped"),
        [(False, False, True, False), (True, False, False, False), (True, True, False, True)]
        + [(False, True, True, True)],
    )
    def test_evicted_backuped_properties(
        self, has_value: bool, has_host_value: bool, evicted: bool, backuped: bool
    ) -> None:
        node = TreeNode()
        if has_value:
            node.value = torch.tensor([1, 2, 3])
        if has_host_value:
            node.host_value = torch.tensor([4, 5, 6])
        assert (node.evicted, node.backuped) == (evicted, backuped)

    @pytest.mark.xfail(
        strict=True,
        raises=AttributeError,
        reason="no per-node host reference counter: the host tier keeps its own transfer "
        "locks (HostTier.transfer_locks) and host-only nodes are evicted by evict_host",
    )
    def test_protect_release_host(self) -> None:
        node = TreeNode()
        node.protect_host()  # type: ignore[attr-defined]

    def test_get_last_hash_value(self) -> None:
        node = TreeNode()
        assert node.get_last_hash_value() is None
        node.hash_value = [b"h1", b"h2", b"h3"]
        assert node.get_last_hash_value() == b"h3"

    @pytest.mark.xfail(
        strict=True,
        raises=TypeError,
        reason="nodes are not ordered: times are ticks of the owning cache's logical clock "
        "and eviction policies order leaves by their own keys",
    )
    def test_lt_comparison(self) -> None:
        assert TreeNode() < TreeNode()  # type: ignore[operator]

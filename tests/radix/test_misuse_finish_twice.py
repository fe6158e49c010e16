"""Finishing a request twice (or caching it after it finished) raises and changes nothing."""

from __future__ import annotations

import pytest

from .req_rig import KINDS, Rig


@pytest.fixture(params=[(k, p) for k in KINDS for p in (1, 4)], ids=str)
def rig(request) -> Rig:
    rig = Rig(*request.param)
    rig.finish(rig.schedule(list(range(1, 11))))
    return rig


@pytest.mark.parametrize("call", ["cache_finished_req", "cache_unfinished_req"])
def test_second_finish_raises_and_keeps_tree_slots(rig, call):
    req = rig.schedule(list(range(1, 19)))
    rig.finish(req)
    before = rig.state()
    with pytest.raises(ValueError, match="req_pool_idx"):
        getattr(rig.cache, call)(req)
    assert rig.state() == before
    rig.check()
    # the tree still owns its slots: they are not free and a new request hits them
    hit = rig.cache.match_prefix(list(range(1, 19))).device_indices
    free = set(rig.allocator.free_slots().tolist())
    assert len(hit) == 18 - 18 % rig.page_size and not free & set(hit.tolist())


def test_finish_after_the_row_was_reused_raises(rig):
    """The row went to another request in between: the stale request cannot touch it."""
    old = rig.schedule([40, 41, 42, 43])
    row = old.req_pool_idx
    rig.finish(old)
    others = [rig.schedule([50 + i, 51, 52, 53, 54]) for i in range(4)]  # every row in use
    assert row in [r.req_pool_idx for r in others]
    before = rig.state()
    with pytest.raises(ValueError, match="req_pool_idx"):
        rig.cache.cache_finished_req(old)
    assert rig.state() == before
    for new in others:
        rig.finish(new)
    rig.check()
    assert len(rig.cache.match_prefix([50, 51, 52, 53]).device_indices) == 4


def test_finished_request_releases_row_id(rig):
    req = rig.schedule([7, 8, 9, 10])
    rig.finish(req)
    assert req.req_pool_idx is None and req.last_node is None
    assert rig.req_pool.available_size() == 4

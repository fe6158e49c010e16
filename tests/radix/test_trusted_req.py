"""``cache_*_req(req, trusted=True)`` (the engine's own requests) and ``ReqToTokenPool.write(...,
trusted=True)``: the same outcome as the checked calls; ``kv_len`` is still checked."""

from __future__ import annotations

import re

import pytest
import torch

from hicache.pools import ReqToTokenPool

from .req_rig import KINDS, Rig


def run(rig: Rig, trusted: bool) -> tuple:
    """Two requests sharing a prefix: one cached unfinished, then both finished."""
    first = rig.schedule(list(range(1, 23)))
    rig.cache.cache_unfinished_req(first, trusted=trusted)
    second = rig.schedule([*range(1, 17), 40, 41, 42])
    for req in (second, first):
        rig.cache.cache_finished_req(req, trusted=trusted)
        rig.live.remove(req)
    rig.check()
    (shape, prefixes, nodes, sizes), *pools = rig.state()
    shape = re.sub(r"#\d+", "#", shape)  # node ids: a global counter
    return shape, prefixes, sorted(node[1:] for node in nodes), sizes, pools


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_trusted_requests_leave_the_state_the_checked_calls_leave(kind: str, page_size: int):
    checked = run(Rig(kind, page_size), trusted=False)
    assert run(Rig(kind, page_size), trusted=True) == checked


@pytest.mark.parametrize("kind", KINDS)
def test_a_trusted_request_still_has_its_kv_len_checked(kind: str) -> None:
    rig = Rig(kind)
    req = rig.schedule(list(range(1, 9)))
    before = rig.state()
    req.kv_len = 99
    with pytest.raises(ValueError, match="kv_len"):
        rig.cache.cache_finished_req(req, trusted=True)
    assert rig.state() == before


def test_a_trusted_table_write_matches_the_checked_one_and_a_row_free_still_checks() -> None:
    pools = ReqToTokenPool(2, 16, "cpu"), ReqToTokenPool(2, 16, "cpu")
    slots = torch.arange(32, 40, dtype=torch.int64)
    for pool, trusted in zip(pools, (False, True), strict=True):
        pool.write((1, slice(3, 11)), slots, trusted=trusted)
    assert torch.equal(pools[0].req_to_token, pools[1].req_to_token)
    assert pools[1].req_to_token[1, 3:11].tolist() == list(range(32, 40))
    pool = pools[0]
    row = pool.alloc(1)
    assert row is not None
    pool.free(row[0])
    with pytest.raises(ValueError, match="currently allocated"):
        pool.free(row[0])  # freed twice
    with pytest.raises(TypeError):
        pool.free(True)

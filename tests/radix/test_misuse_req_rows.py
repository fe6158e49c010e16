"""Bad request rows and request fields: a clear error before any change, then a normal finish."""

from __future__ import annotations

import numpy as np
import pytest

from .req_rig import KINDS, Rig

IDS = list(range(1, 13))


@pytest.fixture(params=[(k, p) for k in KINDS for p in (1, 4)], ids=str)
def rig(request) -> Rig:
    rig = Rig(*request.param)
    rig.finish(rig.schedule(IDS[:8]))
    return rig


NEVER_ALLOCATED = "never allocated"
BAD_ROWS = [
    (None, ValueError),
    (-1, IndexError),
    (4, IndexError),
    (10**12, IndexError),
    (True, TypeError),
    (1.0, TypeError),
    ("0", TypeError),
    (np.float32(0), TypeError),
    (NEVER_ALLOCATED, ValueError),
]


@pytest.mark.parametrize(("bad", "error"), BAD_ROWS, ids=repr)
@pytest.mark.parametrize("call", ["cache_finished_req", "cache_unfinished_req"])
def test_bad_row_ids(rig, call, bad, error):
    req = rig.schedule(IDS)
    good = req.req_pool_idx
    if bad is NEVER_ALLOCATED:
        bad = next(r for r in range(4) if not rig.req_pool.is_allocated(r))
    req.req_pool_idx = bad
    before = rig.state()
    with pytest.raises(error, match="req_pool_idx"):
        getattr(rig.cache, call)(req)
    assert rig.state() == before
    req.req_pool_idx = good
    rig.finish(req)
    rig.check()


def _break(req, rig, field):
    if field == "kv_len_past_row":
        req.origin_input_ids = list(range(1, 200))
        req.kv_len = 199
    elif field == "protected_past_lock":
        req.cache_protected_len = 8 + rig.page_size * 2
    elif field == "protected_unaligned":
        req.cache_protected_len = 7 if rig.page_size > 1 else -1
    elif field == "protected_not_int":
        req.cache_protected_len = 8.0
    elif field == "priority_float":
        req.priority = 1.5
    elif field == "last_node_off_path":
        other = rig.schedule([90, 91, 92, 93, 94, 95, 96, 97])
        rig.finish(other)
        node = rig.cache.match_prefix([90, 91, 92, 93, 94, 95, 96, 97]).last_device_node
        rig.cache.inc_lock_ref(node)
        rig.cache.dec_lock_ref(req.last_node)
        req.last_node = node
    elif field == "row_unwritten":  # the scheduler never wrote its own slots: padding slot 0
        rig.req_pool.write((req.req_pool_idx, slice(8, 12)), 0)


FIELDS = [
    "kv_len_past_row",
    "protected_past_lock",
    "protected_unaligned",
    "protected_not_int",
    "priority_float",
    "last_node_off_path",
    "row_unwritten",
]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("call", ["cache_finished_req", "cache_unfinished_req"])
def test_bad_request_fields(rig, call, field):
    req = rig.schedule(IDS)
    _break(req, rig, field)
    before = rig.state()
    with pytest.raises((TypeError, ValueError, IndexError), match="req"):
        getattr(rig.cache, call)(req)
    assert rig.state() == before
    rig.cache.check_invariants()

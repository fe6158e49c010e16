"""Mooncake objects carry their trailer: a damaged object is a counted miss, removed."""

from __future__ import annotations

import pytest

from hicache.backends.keys import object_keys
from hicache.backends.mooncake_servers import MooncakeServers
from tests.storage_mooncake.helpers import fill_random, fresh_keys, host_pool, page_bytes, slots
from tests.storage_mooncake.test_mooncake import raw_client, store_for

pytestmark = pytest.mark.mooncake


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_damaged_object_is_a_counted_miss_and_removed(
    mooncake: MooncakeServers, layout: str
) -> None:
    pool = host_pool("mha", layout)
    fill_random(pool, seed=17)
    store = store_for(mooncake, pool)
    keys = fresh_keys(3)
    assert store.batch_set_v1(keys, slots([0, 1, 2])) == [True] * 3
    raw = raw_client(mooncake)
    victim = object_keys(keys[1], 2)[1]
    data = bytearray(raw.get(victim))
    assert len(data) == store.page_io().stored_bytes
    data[len(data) // 3] ^= 0x04  # one flipped bit, same size
    assert raw.remove(victim, True) == 0 and raw.put(victim, bytes(data)) == 0
    raw.close()
    expected = [page_bytes(pool, p) for p in (0, 2)]
    assert store.batch_get_v1(keys, slots([4, 5, 6])) == [True, False, True]
    assert [page_bytes(pool, p) for p in (4, 6)] == expected
    assert store.fault_counts() == {"checksum_mismatch": 1}
    assert store.batch_exists(keys[1:2]) == 0  # removed
    store.close()

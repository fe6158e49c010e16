"""A writer process: ``python -m tests.storage_mooncake.writer MASTER SEED KEY...`` writes a
random page_first MHA pool's first pages under the keys and exits (printing the results)."""

from __future__ import annotations

import sys

from hicache.backends.mooncake import MooncakeStore
from tests.storage_mooncake.helpers import fill_random, host_pool, slots


def main() -> None:
    master, seed, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    pool = host_pool("mha", "page_first")
    fill_random(pool, seed)
    store = MooncakeStore(master_server_address=master)
    store.register_mem_pool_host(pool)
    print(store.batch_set_v1(keys, slots(list(range(len(keys))))))
    store.close()


if __name__ == "__main__":
    main()

"""hicache.pools: request rows, slot allocators, device (L1) and host (L2) KV pools."""

from hicache.pools.allocator import TokenToKVPoolAllocator
from hicache.pools.device_pool import KVPool
from hicache.pools.fp4_pools import MHATokenToKVPoolFP4, MLATokenToKVPoolFP4
from hicache.pools.host_layouts import (
    IO_BACKENDS,
    LAYOUTS,
    ROUTES,
    SUPPORTED_PAIRS,
    check_io_backend,
    check_layout,
    check_pair,
)
from hicache.pools.host_pool import HostKVPool
from hicache.pools.mha_pool import MHATokenToKVPool, MHATokenToKVPoolHost
from hicache.pools.mla_pool import MLATokenToKVPool, MLATokenToKVPoolHost
from hicache.pools.protocols import SlotAllocator
from hicache.pools.req_to_token import ReqToTokenPool

__all__ = [
    "IO_BACKENDS",
    "LAYOUTS",
    "ROUTES",
    "SUPPORTED_PAIRS",
    "HostKVPool",
    "KVPool",
    "MHATokenToKVPool",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "MLATokenToKVPoolHost",
    "ReqToTokenPool",
    "SlotAllocator",
    "TokenToKVPoolAllocator",
    "check_io_backend",
    "check_layout",
    "check_pair",
]

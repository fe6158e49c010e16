"""hicache.pools: request rows, slot allocators, device (L1) and host (L2) KV pools."""

from hicache.pools.allocator import TokenToKVPoolAllocator
from hicache.pools.device_pool import KVPool
from hicache.pools.double_sparse_pool import DoubleSparseTokenToKVPool
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
from hicache.pools.hybrid_host_pool import HybridKVPoolHost, host_pool_class
from hicache.pools.hybrid_linear_pool import HybridLinearKVPool
from hicache.pools.hybrid_req_pool import HybridReqToTokenPool
from hicache.pools.mamba_host_pool import MambaPoolHost
from hicache.pools.mamba_params import MambaStateParams
from hicache.pools.mamba_pool import MambaPool
from hicache.pools.mha_pool import MHATokenToKVPool, MHATokenToKVPoolHost
from hicache.pools.mla_pool import MLATokenToKVPool, MLATokenToKVPoolHost
from hicache.pools.nsa_pool import NSATokenToKVPool
from hicache.pools.protocols import DevicePool, HostPool, SlotAllocator
from hicache.pools.req_to_token import ReqToTokenPool
from hicache.pools.state_checkpoint import (
    checkpoint_states,
    checkpoint_tracked,
    release_states,
    restore_states,
    track_states,
)
from hicache.pools.swa_allocator import SWATokenToKVPoolAllocator
from hicache.pools.swa_pool import SWAKVPool

__all__ = [
    "IO_BACKENDS",
    "LAYOUTS",
    "ROUTES",
    "SUPPORTED_PAIRS",
    "DevicePool",
    "DoubleSparseTokenToKVPool",
    "HostKVPool",
    "HostPool",
    "HybridKVPoolHost",
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "KVPool",
    "MHATokenToKVPool",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "MLATokenToKVPoolHost",
    "MambaPool",
    "MambaPoolHost",
    "MambaStateParams",
    "NSATokenToKVPool",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "SlotAllocator",
    "TokenToKVPoolAllocator",
    "check_io_backend",
    "check_layout",
    "check_pair",
    "host_pool_class",
    "checkpoint_states",
    "checkpoint_tracked",
    "release_states",
    "restore_states",
    "track_states",
]

"""Page objects of the host pools beyond one KV pool: a hybrid model's KV and recurrent states.

Backends rely on one page shape (``PageIO``: ``parts`` objects of ``object_bytes`` each), so
these pools are presented in it; every backend (memory, file, mooncake) stores them unchanged.

- ``CompositePageIO`` (a ``HybridKVPoolHost``): a page is ONE object (``parts == 1``) whose
  bytes are every inner pool's objects of that page, concatenated in a fixed order: the inner
  pools in ``host_pools`` order (the full-attention pool first, then the SWA one), each pool's
  parts in its own order (K then V; MLA's latent), each part in that pool's ``PageIO`` bytes.
  It is a gathered copy (``zero_copy`` False): ``source`` concatenates, ``commit`` scatters.
  Its trailer carries the page's checksum row under ``verify`` (``PageIntegrity``'s store: a
  block per inner pool), ``NO_SUM`` without.
- ``StatePageIO`` (a ``MambaPoolHost``): one state per "page" of one slot (``page_size`` 1), its
  object the slot's flat row (``MambaPoolHost.page_bytes``), zero-copy. Host slots are the
  state pool's, ``1 .. size`` (``slot_limit`` is ``size + 1``); trailers carry ``NO_SUM``.

``page_io_of`` picks the ``PageIO`` of a registered host pool.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.backends.pages import PageIO
from hicache.pools.host_pool import HostKVPool
from hicache.pools.hybrid_host_pool import HybridKVPoolHost
from hicache.pools.mamba_host_pool import MambaPoolHost

__all__ = ["CompositePageIO", "StatePageIO", "page_io_of"]

STATE_LAYOUT = "state"  # the ``layout`` of a state page (in its fingerprint)


class CompositePageIO(PageIO):
    """One object per page of a ``HybridKVPoolHost``; see the module docstring."""

    def __init__(self, host_pool: HybridKVPoolHost) -> None:
        self.host_pool = host_pool
        self.inner = [PageIO(pool) for pool in host_pool.host_pools]
        sizes = [io.object_bytes for io in self.inner for _ in range(io.parts)]
        self._cuts = np.cumsum([0, *sizes]).tolist()  # object i of the page: [cuts[i], cuts[i+1])
        self._frame(1, self._cuts[-1], host_pool.page_size, host_pool.layout)
        self._size(host_pool.size, host_pool.layer_num)

    def source(self, slot: int) -> list[np.ndarray]:
        return [np.concatenate([obj for io in self.inner for obj in io.source(slot)])]

    def commit(self, slot: int, filled: list[np.ndarray]) -> None:
        """Scatter the page's one object into every inner pool's page at ``slot``."""
        (page,) = filled
        index = 0
        for io in self.inner:
            targets = io.target(slot)
            for target in targets:
                target[:] = page[self._cuts[index] : self._cuts[index + 1]]
                index += 1
            io.commit(slot, targets)

    def regions(self) -> list[tuple[int, int]]:
        return [region for io in self.inner for region in io.regions()]


class StatePageIO(PageIO):
    """One object per recurrent state of a ``MambaPoolHost``; see the module docstring."""

    def __init__(self, host_states: MambaPoolHost) -> None:
        self.host_pool = host_states
        self._frame(1, host_states.slot_bytes, 1, STATE_LAYOUT)
        self._size(host_states.size + 1, 1)
        self.zero_copy = True

    def attach_checksums(self, store: torch.Tensor) -> None:
        raise ValueError("recurrent states carry no checksums")

    def _objects(self, slot: int) -> list[np.ndarray]:
        return [self.host_pool.page_bytes(slot).numpy()]

    def regions(self) -> list[tuple[int, int]]:
        flat = self.host_pool.flat
        return [(flat.data_ptr(), flat.numel())]


def page_io_of(host_pool: Any) -> PageIO:
    """The ``PageIO`` of ``host_pool``: a ``HostKVPool``'s, a ``HybridKVPoolHost``'s
    (``CompositePageIO``) or a ``MambaPoolHost``'s (``StatePageIO``); ``TypeError`` else."""
    if isinstance(host_pool, HostKVPool):
        return PageIO(host_pool)
    if isinstance(host_pool, HybridKVPoolHost):
        return CompositePageIO(host_pool)
    if isinstance(host_pool, MambaPoolHost):
        return StatePageIO(host_pool)
    raise TypeError(
        "mem_pool_host must be a HostKVPool, HybridKVPoolHost or MambaPoolHost, "
        f"got {type(host_pool).__name__}"
    )

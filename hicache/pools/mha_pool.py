"""Multi-head attention pools: the device pool (L1) and its host pool (L2)."""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.pools.device_pool import KVPool, pointer_table
from hicache.pools.host_pool import HostKVPool


class MHATokenToKVPool(KVPool):
    """Multi-head attention KV: ``k_buffer[l]``, ``v_buffer[l]`` of ``[size + page_size, H, D]``.

    ``k_data_ptrs``/``v_data_ptrs`` are uint64 tables of the layer buffers' addresses on
    ``device``; ``item_size = head_num * head_dim * elem_size`` bytes.
    """

    kind = "MHA"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str,
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, device)
        self.head_num = check_int("head_num", head_num, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.k_buffer = self._new_layers((self.num_slots, head_num, head_dim))
        self.v_buffer = self._new_layers((self.num_slots, head_num, head_dim))
        self.k_data_ptrs = pointer_table(self.k_buffer, self.device)
        self.v_data_ptrs = pointer_table(self.v_buffer, self.device)

    @property
    def item_size(self) -> int:
        return self.head_num * self.head_dim * self.store_dtype.itemsize

    def _dims(self) -> dict[str, int]:
        return {"head_num": self.head_num, "head_dim": self.head_dim}

    @property
    def part_buffers(self) -> list[list[torch.Tensor]]:
        """Per-layer buffers of each part: ``[k_buffer, v_buffer]``."""
        return [self.k_buffer, self.v_buffer]

    @property
    def part_data_ptrs(self) -> list[torch.Tensor]:
        return [self.k_data_ptrs, self.v_data_ptrs]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys, ``[size + page_size, H, D]`` in ``dtype``."""
        self._wait_layer(layer_id)
        return self._view(self.k_buffer[layer_id])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values, ``[size + page_size, H, D]`` in ``dtype``."""
        self._wait_layer(layer_id)
        return self._view(self.v_buffer[layer_id])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of layer ``layer_id`` (one wait)."""
        self._wait_layer(layer_id)
        return self._view(self.k_buffer[layer_id]), self._view(self.v_buffer[layer_id])

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write ``cache_k``, ``cache_v`` (``[len(loc), H, D]``, ``dtype``, ``device``) at ``loc``.

        fp8 pools also take floating inputs and cast them to ``dtype``. Nothing is written when
        an argument is invalid.
        """
        self.check_layer(layer_id)
        self._check_loc(loc)
        shape = (loc.numel(), self.head_num, self.head_dim)
        k = self._to_store("cache_k", cache_k, shape)
        v = self._to_store("cache_v", cache_v, shape)
        self.k_buffer[layer_id][loc] = k
        self.v_buffer[layer_id][loc] = v


class MHATokenToKVPoolHost(HostKVPool):
    """Host pool for ``MHATokenToKVPool``: ``kv_buffer`` of ``(2, *part_shape)``;
    ``k_buffer = kv_buffer[0]``, ``v_buffer = kv_buffer[1]`` (shapes in :mod:`host_layouts`)."""

    parts = 2
    device_pool_type = MHATokenToKVPool

    def _head_dim(self) -> int:
        assert isinstance(self.device_pool, MHATokenToKVPool), "checked in __init__"
        return self.device_pool.head_dim

    @property
    def kv_buffer(self) -> torch.Tensor:
        return self._buffer

    @property
    def k_buffer(self) -> torch.Tensor:
        return self._buffer[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        return self._buffer[1]

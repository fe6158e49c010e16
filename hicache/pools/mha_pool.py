"""Multi-head attention pools: the device pool (L1) and its host pool (L2)."""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.pools.device_pool import KVPool, pointer_table
from hicache.pools.host_pool import HostKVPool


class MHATokenToKVPool(KVPool):
    """Multi-head attention KV: ``k_buffer[l]`` of ``[size + page_size, H, D]`` and
    ``v_buffer[l]`` of ``[size + page_size, H, Dv]`` (``Dv = v_head_dim``, default ``D``).

    ``k_data_ptrs``/``v_data_ptrs`` are uint64 tables of the layer buffers' addresses on
    ``device``; ``item_size = head_num * head_dim * elem_size`` bytes (K's row; V's equals it
    unless ``v_head_dim`` differs, which the host pools refuse). As in SGLang, ``swa_head_num``,
    ``swa_head_dim``, ``swa_v_head_dim`` replace ``head_num``, ``head_dim``, ``v_head_dim`` when
    given (the sliding-window sub-pool of a hybrid model); ``start_layer``/``end_layer``,
    ``enable_kv_cache_copy`` and ``enable_memory_saver`` are described on :class:`KVPool`.
    SGLang's ``enable_alt_stream`` (a second CUDA stream for the K and V writes) is not taken.
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
        *,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_kv_cache_copy: bool = False,
        enable_memory_saver: bool = False,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            start_layer,
            end_layer,
            enable_kv_cache_copy,
            enable_memory_saver,
        )
        check_int("head_num", head_num, minimum=1)
        check_int("head_dim", head_dim, minimum=1)
        self.head_num = _override("swa_head_num", swa_head_num, head_num)
        self.head_dim = _override("swa_head_dim", swa_head_dim, head_dim)
        v_dim = _override("v_head_dim", v_head_dim, head_dim)
        self.v_head_dim = _override("swa_v_head_dim", swa_v_head_dim, v_dim)
        self._create_buffers()
        self._init_kv_copy()

    def _create_buffers(self) -> None:
        self.k_buffer = self._new_layers((self.num_slots, self.head_num, self.head_dim))
        self.v_buffer = self._new_layers((self.num_slots, self.head_num, self.v_head_dim))
        self.k_data_ptrs = pointer_table(self.k_buffer, self.device)
        self.v_data_ptrs = pointer_table(self.v_buffer, self.device)

    @property
    def item_size(self) -> int:
        return self.head_num * self.head_dim * self.store_dtype.itemsize

    def _dims(self) -> dict[str, int]:
        return {"head_num": self.head_num, "head_dim": self.head_dim, "v_head_dim": self.v_head_dim}

    @property
    def part_buffers(self) -> list[list[torch.Tensor]]:
        """Per-layer buffers of each part: ``[k_buffer, v_buffer]``."""
        return [self.k_buffer, self.v_buffer]

    @property
    def part_data_ptrs(self) -> list[torch.Tensor]:
        return [self.k_data_ptrs, self.v_data_ptrs]

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(K bytes, V bytes)`` as SGLang: row-buffer kinds at even positions count as K,
        odd ones as V (``k, v`` then, e.g., ``k_scale, v_scale``)."""
        sizes = self._kind_bytes()
        return sum(sizes[0::2]), sum(sizes[1::2])

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys, ``[size + page_size, H, D]`` in ``dtype``."""
        return self._view(self.k_buffer[self._wait_layer(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values, ``[size + page_size, H, Dv]`` in ``dtype``."""
        return self._view(self.v_buffer[self._wait_layer(layer_id)])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of layer ``layer_id`` (one wait)."""
        local = self._wait_layer(layer_id)
        return self._view(self.k_buffer[local]), self._view(self.v_buffer[local])

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write ``cache_k`` (``[len(loc), H, D]``) and ``cache_v`` (``[len(loc), H, Dv]``), in
        ``dtype`` on ``device``, at ``loc`` of layer ``layer_id`` (global id).

        fp8 pools also take floating inputs and cast them to ``dtype``. Nothing is written when
        an argument is invalid.
        """
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        k = self._to_store("cache_k", cache_k, (loc.numel(), self.head_num, self.head_dim))
        v = self._to_store("cache_v", cache_v, (loc.numel(), self.head_num, self.v_head_dim))
        self.k_buffer[local][loc] = k
        self.v_buffer[local][loc] = v


def _override(name: str, value: int | None, default: int) -> int:
    """``value`` checked as a positive int, or ``default`` when it is None."""
    return default if value is None else check_int(name, value, minimum=1)


class MHATokenToKVPoolHost(HostKVPool):
    """Host pool for ``MHATokenToKVPool``: ``kv_buffer`` of ``(2, *part_shape)``;
    ``k_buffer = kv_buffer[0]``, ``v_buffer = kv_buffer[1]`` (shapes in :mod:`host_layouts`)."""

    parts = 2
    device_pool_type = MHATokenToKVPool

    @classmethod
    def _check_args(
        cls,
        device_pool: KVPool,
        page_size: int,
        layout: str,
        pin_memory: bool,
        io_backend: str | None,
    ) -> None:
        super()._check_args(device_pool, page_size, layout, pin_memory, io_backend)
        assert isinstance(device_pool, MHATokenToKVPool), "checked by HostKVPool"
        if device_pool.v_head_dim != device_pool.head_dim:
            raise ValueError(
                "device_pool must have v_head_dim == head_dim for a host pool (its layouts "
                f"keep K and V rows of one size), got head_dim={device_pool.head_dim}, "
                f"v_head_dim={device_pool.v_head_dim}"
            )

    @property
    def kv_buffer(self) -> torch.Tensor:
        return self._buffer

    @property
    def k_buffer(self) -> torch.Tensor:
        return self._buffer[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        return self._buffer[1]

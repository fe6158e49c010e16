"""Multi-head latent attention pools: the device pool (L1) and its host pool (L2)."""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.pools.device_pool import KVPool, pointer_table
from hicache.pools.host_pool import HostKVPool


class MLATokenToKVPool(KVPool):
    """Multi-head latent attention: one latent per token, ``kv_buffer[l]`` of
    ``[size + page_size, 1, kv_lora_rank + qk_rope_head_dim]``.

    ``get_key_buffer`` returns the whole latent, ``get_value_buffer`` its first
    ``kv_lora_rank`` channels; ``item_size = (kv_lora_rank + qk_rope_head_dim) * elem_size``.
    """

    kind = "MLA"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device | str,
        *,
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
        self.kv_lora_rank = check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        self.qk_rope_head_dim = check_int("qk_rope_head_dim", qk_rope_head_dim, minimum=0)
        self.head_num = 1
        self.kv_dim = kv_lora_rank + qk_rope_head_dim
        self._create_buffers()
        self._init_kv_copy()

    def _create_buffers(self) -> None:
        self.kv_buffer = self._new_layers((self.num_slots, 1, self.kv_dim))
        self.kv_data_ptrs = pointer_table(self.kv_buffer, self.device)

    @property
    def item_size(self) -> int:
        return self.kv_dim * self.store_dtype.itemsize

    def _dims(self) -> dict[str, int]:
        return {"kv_lora_rank": self.kv_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim}

    @property
    def part_buffers(self) -> list[list[torch.Tensor]]:
        """Per-layer buffers of each part: ``[kv_buffer]``."""
        return [self.kv_buffer]

    @property
    def part_data_ptrs(self) -> list[torch.Tensor]:
        return [self.kv_data_ptrs]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s latents, ``[size + page_size, 1, kv_dim]`` in ``dtype``."""
        return self._view(self.kv_buffer[self._wait_layer(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The first ``kv_lora_rank`` channels: ``[size + page_size, 1, kv_lora_rank]``."""
        return self._view(self.kv_buffer[self._wait_layer(layer_id)])[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(latents, latents[..., :kv_lora_rank])`` of layer ``layer_id`` (one wait)."""
        latent = self._view(self.kv_buffer[self._wait_layer(layer_id)])
        return latent, latent[..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_kv: torch.Tensor) -> None:
        """Write ``cache_kv`` (``[len(loc), 1, kv_dim]``, ``dtype``, on ``device``) at ``loc``."""
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        kv = self._to_store("cache_kv", cache_kv, (loc.numel(), 1, self.kv_dim))
        self.kv_buffer[local][loc] = kv


class MLATokenToKVPoolHost(HostKVPool):
    """Host pool for ``MLATokenToKVPool``: ``kv_buffer`` of ``part_shape`` with ``H = 1``,
    ``D = kv_lora_rank + qk_rope_head_dim``; no ``page_head`` layout."""

    parts = 1
    layouts = ("layer_first", "page_first", "page_first_direct")
    device_pool_type = MLATokenToKVPool

    @property
    def kv_buffer(self) -> torch.Tensor:
        return self._buffer[0]

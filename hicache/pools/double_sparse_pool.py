"""Double sparsity device pool: MHA keys and values plus each token's heavy-channel labels."""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.pools.mha_pool import MHATokenToKVPool


class DoubleSparseTokenToKVPool(MHATokenToKVPool):
    """:class:`MHATokenToKVPool` plus ``label_buffer[l]`` of ``[size + page_size, H,
    heavy_channel_num]`` in ``dtype`` (fp8 stored as uint8): per token and head, the key's
    heavy channels that double-sparsity attention scores with.

    ``row_buffers`` is ``[k_buffer, v_buffer, label_buffer]``, so ``move_kv_cache``, the CPU
    copies and buffer infos carry the labels; ``get_kv_size_bytes`` counts them with the keys
    (``(K + label bytes, V bytes)``). The host tier does not carry the labels, so host pools
    refuse this pool.
    """

    kind = "DoubleSparse"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str,
        heavy_channel_num: int,
        *,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_kv_cache_copy: bool = False,
        enable_memory_saver: bool = False,
    ) -> None:
        # set before the base constructor: its _create_buffers() makes the labels too
        self.heavy_channel_num = check_int("heavy_channel_num", heavy_channel_num, minimum=1)
        super().__init__(
            size,
            page_size,
            dtype,
            head_num,
            head_dim,
            layer_num,
            device,
            start_layer=start_layer,
            end_layer=end_layer,
            enable_kv_cache_copy=enable_kv_cache_copy,
            enable_memory_saver=enable_memory_saver,
        )

    def _create_buffers(self) -> None:
        super()._create_buffers()
        shape = (self.num_slots, self.head_num, self.heavy_channel_num)
        self.label_buffer = self._new_layers(shape)

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        """``[k_buffer, v_buffer, label_buffer]``."""
        return [*self.part_buffers, self.label_buffer]

    def _dims(self) -> dict[str, int]:
        return {**super()._dims(), "heavy_channel_num": self.heavy_channel_num}

    def get_label_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s labels, ``[size + page_size, H, heavy_channel_num]`` in
        ``dtype``."""
        return self._view(self.label_buffer[self._wait_layer(layer_id)])

    def set_kv_buffer(  # type: ignore[override]  # SGLang's signature: labels too
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        cache_label: torch.Tensor,
    ) -> None:
        """Write ``cache_k``, ``cache_v`` (``[len(loc), H, D]``) and ``cache_label``
        (``[len(loc), H, heavy_channel_num]``), all ``dtype`` on ``device``, at ``loc``.

        fp8 pools also take floating inputs and cast them. Nothing is written when an argument
        is invalid.
        """
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        shape = (loc.numel(), self.head_num, self.heavy_channel_num)
        label = self._to_store("cache_label", cache_label, shape)
        super().set_kv_buffer(layer_id, loc, cache_k, cache_v)  # checks K and V first
        self.label_buffer[local][loc] = label

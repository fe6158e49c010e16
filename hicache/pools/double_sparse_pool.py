"""Double sparsity device pool: MHA keys and values plus each token's heavy-channel labels."""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.pools.mha_pool import MHATokenToKVPool


class DoubleSparseTokenToKVPool(MHATokenToKVPool):
    """:class:`MHATokenToKVPool` plus ``label_buffer[l]`` of ``[size + page_size, H,
    heavy_channel_num]`` in ``dtype`` (fp8 stored as uint8): per token and head, the key's
    heavy channels that double-sparsity attention scores with.

    The host tier does not carry the labels, so host pools refuse this pool.
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
    ) -> None:
        super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device)
        self.heavy_channel_num = check_int("heavy_channel_num", heavy_channel_num, minimum=1)
        self.label_buffer = self._new_layers((self.num_slots, head_num, heavy_channel_num))

    def _dims(self) -> dict[str, int]:
        return {**super()._dims(), "heavy_channel_num": self.heavy_channel_num}

    def get_label_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s labels, ``[size + page_size, H, heavy_channel_num]`` in
        ``dtype``."""
        self._wait_layer(layer_id)
        return self._view(self.label_buffer[layer_id])

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
        self.check_layer(layer_id)
        self._check_loc(loc)
        shape = (loc.numel(), self.head_num, self.heavy_channel_num)
        label = self._to_store("cache_label", cache_label, shape)
        super().set_kv_buffer(layer_id, loc, cache_k, cache_v)  # checks K and V first
        self.label_buffer[layer_id][loc] = label

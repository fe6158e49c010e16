"""FP4 (E2M1) device pools: KV stored as packed 4-bit codes plus one scale byte per 16 values.

The format and its error bound are :mod:`hicache.kernels.fp4`'s. Buffers keep SGLang's shapes:
data ``[size + page_size, H, D // 2]`` uint8 and scales ``[size + page_size, H * D // 16]``
uint8 per layer. ``dtype`` is what the model writes and reads (float16, bfloat16 or float32);
``store_dtype`` is uint8. ``set_kv_buffer`` quantizes; the getters dequantize the whole layer
into a new tensor (as SGLang's do), so writing to what they return does not reach the pool.
``row_buffers`` adds the scale buffers to the data buffers, so slot moves and copies carry them.

The host tier does not carry FP4 pools yet: their ``kind`` (``"MHA_FP4"``, ``"MLA_FP4"``)
differs from what the host pools are built for, and ``HostKVPool`` refuses them.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.kernels.fp4 import FLOAT_DTYPES, dequantize_fp4, quantize_fp4
from hicache.kernels.fp4_reference import BLOCK
from hicache.pools.device_pool import KVPool, pointer_table
from hicache.pools.mha_pool import MHATokenToKVPool
from hicache.pools.mla_pool import MLATokenToKVPool


class FP4Rows(KVPool):
    """Base of both FP4 pools (first in their bases, before the MHA or MLA pool): the format
    check, buffer creation, checked quantize and dequantize."""

    def _check_format(self, dims: dict[str, int]) -> None:
        """``TypeError`` unless ``dtype`` is a float the quantizer takes, ``ValueError`` unless
        each of ``dims`` is a multiple of 16 (one scale per 16 values of a row); then make
        ``store_dtype`` uint8."""
        if self.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"dtype must be one of {FLOAT_DTYPES} for an FP4 pool, got {self.dtype}"
            )
        for name, value in dims.items():
            if value % BLOCK:
                raise ValueError(
                    f"{name} must be a multiple of {BLOCK} for an FP4 pool, got {value}"
                )
        self.store_dtype = torch.uint8

    def _fp4_layers(self, heads: int, dim: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer data ``[num_slots, heads, dim // 2]`` and scales ``[num_slots, heads * dim
        // 16]``, both uint8 zeros (a zero scale reads back as 0.0)."""
        data = self._new_layers((self.num_slots, heads, dim // 2))
        return data, self._new_layers((self.num_slots, heads * dim // BLOCK))

    def _quantize_input(
        self, name: str, cache: Any, shape: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Check ``cache`` (``shape``, a float dtype, on ``device``); return its packed codes
        ``[n, H, D // 2]`` and scales flattened to SGLang's ``[n, H * D // 16]``."""
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
        if tuple(cache.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(cache.shape)}")
        if cache.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have dtype in {FLOAT_DTYPES}, got {cache.dtype}")
        if cache.device != self.device:
            raise ValueError(f"{name} must be on {self.device}, got {cache.device}")
        packed, scales = quantize_fp4(cache)
        return packed, scales.reshape(shape[0], -1)

    def _dequantize(self, data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """A layer's ``[num_slots, H, D]`` values in ``dtype`` (a new tensor)."""
        return dequantize_fp4(data, scales.view(data.shape[0], data.shape[1], -1), self.dtype)


class MHATokenToKVPoolFP4(FP4Rows, MHATokenToKVPool):
    """:class:`MHATokenToKVPool` stored as FP4: ``k_buffer[l]`` ``[size + page_size, H, D // 2]``
    and ``k_scale_buffer[l]`` ``[size + page_size, H * D // 16]`` uint8 (V alike, with
    ``Dv``); ``D`` and ``Dv`` multiples of 16. ``item_size`` is a packed K row's bytes,
    ``H * D // 2``. Same constructor as :class:`MHATokenToKVPool`."""

    kind = "MHA_FP4"

    def _create_buffers(self) -> None:
        self._check_format({"head_dim": self.head_dim, "v_head_dim": self.v_head_dim})
        self.k_buffer, self.k_scale_buffer = self._fp4_layers(self.head_num, self.head_dim)
        self.v_buffer, self.v_scale_buffer = self._fp4_layers(self.head_num, self.v_head_dim)
        self.k_data_ptrs = pointer_table(self.k_buffer, self.device)
        self.v_data_ptrs = pointer_table(self.v_buffer, self.device)

    @property
    def item_size(self) -> int:
        return self.head_num * self.head_dim // 2

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        """``[k_buffer, v_buffer, k_scale_buffer, v_scale_buffer]``."""
        return [self.k_buffer, self.v_buffer, self.k_scale_buffer, self.v_scale_buffer]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys dequantized: a new ``[size + page_size, H, D]`` in
        ``dtype``."""
        local = self._wait_layer(layer_id)
        return self._dequantize(self.k_buffer[local], self.k_scale_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values dequantized: a new ``[size + page_size, H, Dv]``."""
        local = self._wait_layer(layer_id)
        return self._dequantize(self.v_buffer[local], self.v_scale_buffer[local])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of layer ``layer_id``, dequantized (one wait)."""
        local = self._wait_layer(layer_id)
        return (
            self._dequantize(self.k_buffer[local], self.k_scale_buffer[local]),
            self._dequantize(self.v_buffer[local], self.v_scale_buffer[local]),
        )

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Quantize ``cache_k`` (``[len(loc), H, D]``) and ``cache_v`` (``[len(loc), H, Dv]``),
        float16/bfloat16/float32 on ``device``, into slots ``loc`` of layer ``layer_id``.
        Both are checked and quantized before anything is written."""
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        n = loc.numel()
        k, k_scale = self._quantize_input("cache_k", cache_k, (n, self.head_num, self.head_dim))
        v, v_scale = self._quantize_input("cache_v", cache_v, (n, self.head_num, self.v_head_dim))
        self.k_buffer[local][loc] = k
        self.k_scale_buffer[local][loc] = k_scale
        self.v_buffer[local][loc] = v
        self.v_scale_buffer[local][loc] = v_scale


class MLATokenToKVPoolFP4(FP4Rows, MLATokenToKVPool):
    """:class:`MLATokenToKVPool` stored as FP4: ``kv_buffer[l]`` ``[size + page_size, 1,
    kv_dim // 2]`` and ``kv_scale_buffer[l]`` ``[size + page_size, kv_dim // 16]`` uint8,
    ``kv_dim = kv_lora_rank + qk_rope_head_dim`` a multiple of 16. ``item_size`` is a packed
    row's bytes, ``kv_dim // 2``. Same constructor as :class:`MLATokenToKVPool`."""

    kind = "MLA_FP4"

    def _create_buffers(self) -> None:
        self._check_format({"kv_lora_rank + qk_rope_head_dim": self.kv_dim})
        self.kv_buffer, self.kv_scale_buffer = self._fp4_layers(1, self.kv_dim)
        self.kv_data_ptrs = pointer_table(self.kv_buffer, self.device)

    @property
    def item_size(self) -> int:
        return self.kv_dim // 2

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        """``[kv_buffer, kv_scale_buffer]``."""
        return [self.kv_buffer, self.kv_scale_buffer]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s latents dequantized: a new ``[size + page_size, 1, kv_dim]``."""
        local = self._wait_layer(layer_id)
        return self._dequantize(self.kv_buffer[local], self.kv_scale_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The first ``kv_lora_rank`` channels of the dequantized latents."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(latents, latents[..., :kv_lora_rank])``, dequantized once (one wait)."""
        latent = self.get_key_buffer(layer_id)
        return latent, latent[..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_kv: torch.Tensor) -> None:
        """Quantize ``cache_kv`` (``[len(loc), 1, kv_dim]``, float16/bfloat16/float32, on
        ``device``) into slots ``loc`` of layer ``layer_id``."""
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        kv, scale = self._quantize_input("cache_kv", cache_kv, (loc.numel(), 1, self.kv_dim))
        self.kv_buffer[local][loc] = kv
        self.kv_scale_buffer[local][loc] = scale

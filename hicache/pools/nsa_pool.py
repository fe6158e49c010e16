"""DeepSeek-V3.2 native sparse attention (NSA) device pool: the MLA latent plus the indexer's
FP8 key cache (layout in :mod:`hicache.pools.nsa_index`)."""

from __future__ import annotations

from typing import Any

import torch

from hicache.checks import check_int
from hicache.pools.mla_pool import MLATokenToKVPool
from hicache.pools.nsa_index import QUANT_BLOCK_SIZE, IndexKLayout, check_page_indices

INDEX_K_DTYPE = torch.float8_e4m3fn


def check_tensor(
    name: str, value: object, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: object
) -> torch.Tensor:
    """``value`` if a tensor of one of ``shapes``, ``dtype`` and on ``device``, else
    ``TypeError``/``ValueError`` naming ``name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) not in shapes:
        allowed = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {allowed}, got {tuple(value.shape)}")
    if value.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} must be on {device}, got {value.device}")
    return value


class NSATokenToKVPool(MLATokenToKVPool):
    """MLA latent (as :class:`MLATokenToKVPool`) plus, per layer, the NSA indexer's keys:
    ``index_k_with_scale_buffer[l]`` of ``[(size + page_size) // page_size, page_size *
    (index_head_dim + 4)]`` uint8, each page its FP8 (e4m3) keys then their fp32 scales.

    As SGLang's: ``page_size`` must be 64 and ``index_head_dim`` 128. ``kv_cache_dim``, when
    given, must be ``kv_lora_rank + qk_rope_head_dim`` (SGLang's packed FP8 latent is not
    supported). The host tier does not carry the index buffers, so host pools refuse this pool.
    """

    kind = "NSA"
    quant_block_size = QUANT_BLOCK_SIZE
    index_k_with_scale_buffer_dtype = torch.uint8
    required_page_size = 64
    required_index_head_dim = 128

    def __init__(
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int,
        dtype: torch.dtype,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device | str,
        index_head_dim: int,
        kv_cache_dim: int | None = None,
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
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            start_layer=start_layer,
            end_layer=end_layer,
            enable_kv_cache_copy=enable_kv_cache_copy,
            enable_memory_saver=enable_memory_saver,
        )
        self._check_nsa_args(index_head_dim, kv_cache_dim)
        self.index_head_dim = index_head_dim
        self.kv_cache_dim = self.kv_dim
        self.index_layout = IndexKLayout(page_size, index_head_dim)
        num_pages = self.num_slots // page_size
        self.index_k_with_scale_buffer = [
            self.index_layout.new_buffer(num_pages, self.device) for _ in range(layer_num)
        ]

    def _check_nsa_args(self, index_head_dim: int, kv_cache_dim: int | None) -> None:
        if self.page_size != self.required_page_size:
            raise ValueError(
                f"page_size must be {self.required_page_size} for NSA, got {self.page_size}"
            )
        check_int("index_head_dim", index_head_dim)
        if index_head_dim != self.required_index_head_dim:
            raise ValueError(
                f"index_head_dim must be {self.required_index_head_dim}, got {index_head_dim}"
            )
        if kv_cache_dim is not None and check_int("kv_cache_dim", kv_cache_dim) != self.kv_dim:
            raise ValueError(
                f"kv_cache_dim must be kv_lora_rank + qk_rope_head_dim = {self.kv_dim} (a packed "
                f"FP8 latent is not supported), got {kv_cache_dim}"
            )

    @property
    def index_num_pages(self) -> int:
        """Pages (rows) of each index buffer: ``(size + page_size) // page_size``."""
        return self.num_slots // self.page_size

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s index buffer, ``[index_num_pages, page_size * (index_head_dim +
        4)]`` uint8 on ``device`` (the storage itself)."""
        return self.index_k_with_scale_buffer[self._wait_layer(layer_id)]

    def _gather(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(buffer, page, offset)`` of a sequence's ``seq_len`` tokens, after every check and
        the layer wait."""
        check_int("seq_len", seq_len)
        needed = -(-seq_len // self.page_size)
        check_page_indices(page_indices, needed, self.index_num_pages)
        if page_indices.device != self.device:
            raise ValueError(f"page_indices must be on {self.device}, got {page_indices.device}")
        buf = self.index_k_with_scale_buffer[self._wait_layer(layer_id)]
        page, offset = self.index_layout.sequence(page_indices, seq_len)
        return buf, page, offset

    def get_index_k_continuous(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> torch.Tensor:
        """The FP8 index keys of a sequence's first ``seq_len`` tokens, whose ``i``-th page is
        ``page_indices[i]`` (1-D int32/int64 on ``device``, at least ``ceil(seq_len /
        page_size)`` pages): a new ``[seq_len, index_head_dim]`` uint8 tensor."""
        buf, page, offset = self._gather(layer_id, seq_len, page_indices)
        return self.index_layout.keys(buf)[page, offset]

    def get_index_k_scale_continuous(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> torch.Tensor:
        """The fp32 scales of those tokens as bytes: a new ``[seq_len, 4]`` uint8 tensor."""
        buf, page, offset = self._gather(layer_id, seq_len, page_indices)
        return self.index_layout.scales(buf)[page, offset]

    def get_index_k_scale_buffer(
        self, layer_id: int, seq_len: int, page_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both at once (one check, one wait): ``(keys [seq_len, index_head_dim], scales
        [seq_len, 4])``, uint8."""
        buf, page, offset = self._gather(layer_id, seq_len, page_indices)
        layout = self.index_layout
        return layout.keys(buf)[page, offset], layout.scales(buf)[page, offset]

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Store tokens ``loc`` (``[n]`` slots)' index keys ``index_k`` (``[n, index_head_dim]``
        float8_e4m3fn) and scales ``index_k_scale`` (``[n]`` or ``[n, 1]`` float32), both on
        ``device``, in layer ``layer_id``'s pages. Nothing is written when an argument is
        invalid."""
        local = self._local_layer(layer_id)
        self._check_loc(loc)
        n = loc.numel()  # one fp32 scale per token: index_head_dim == quant_block_size
        check_tensor("index_k", index_k, [(n, self.index_head_dim)], INDEX_K_DTYPE, self.device)
        check_tensor("index_k_scale", index_k_scale, [(n,), (n, 1)], torch.float32, self.device)
        scales = index_k_scale.reshape(n, 1).contiguous().view(torch.uint8)
        buf = self.index_k_with_scale_buffer[local]
        self.index_layout.write(buf, loc, index_k.view(torch.uint8), scales)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move the latents (:meth:`KVPoolOps.move_kv_cache`, which checks both first) and the
        index keys and scales of slots ``src_loc`` to ``tgt_loc``, token by token."""
        super().move_kv_cache(tgt_loc, src_loc)
        for buf in self.index_k_with_scale_buffer:
            self.index_layout.move(buf, tgt_loc, src_loc)

    def get_cpu_copy(  # type: ignore[override]  # SGLang's dict of the latents and the index
        self, indices: torch.Tensor
    ) -> dict[str, Any]:
        """As SGLang's: ``{"kv": the latents' copy (:meth:`KVPoolOps.get_cpu_copy`), "index_k":
        [layer] -> (keys [n, index_head_dim], scales [n, 4]) uint8 on the CPU}`` of slots
        ``indices`` (``[n]``)."""
        kv = super().get_cpu_copy(indices)
        index = [self.index_layout.read(b, indices) for b in self.index_k_with_scale_buffer]
        return {"kv": kv, "index_k": [(k.cpu(), s.cpu()) for k, s in index]}

    def load_cpu_copy(  # type: ignore[override]  # SGLang's dict of the latents and the index
        self, kv_cache_cpu: dict[str, Any], indices: torch.Tensor
    ) -> None:
        """Write back ``kv_cache_cpu`` (:meth:`get_cpu_copy` of the same ``indices``): latents,
        index keys and scales; everything is checked before anything is written."""
        self._check_loc(indices, "indices")
        index = self._check_index_copy(kv_cache_cpu, indices.numel())
        super().load_cpu_copy(kv_cache_cpu["kv"], indices)
        for buf, (keys, scales) in zip(self.index_k_with_scale_buffer, index, strict=True):
            self.index_layout.write(buf, indices, keys.to(self.device), scales.to(self.device))

    def _check_index_copy(self, kv_cache_cpu: Any, n: int) -> list[tuple[torch.Tensor, ...]]:
        if not isinstance(kv_cache_cpu, dict) or set(kv_cache_cpu) != {"kv", "index_k"}:
            raise ValueError('kv_cache_cpu must be a dict of "kv" and "index_k"')
        index = kv_cache_cpu["index_k"]
        if not isinstance(index, list) or len(index) != self.layer_num:
            raise ValueError(f'kv_cache_cpu["index_k"] must be a list of {self.layer_num} layers')
        cpu, widths = torch.device("cpu"), (self.index_head_dim, self.index_layout.scale_bytes)
        for pair in index:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError('kv_cache_cpu["index_k"] layers must be (keys, scales) pairs')
            for t, width in zip(pair, widths, strict=True):
                check_tensor('kv_cache_cpu["index_k"]', t, [(n, width)], torch.uint8, cpu)
        return index

    def get_kv_size_bytes(self) -> int:
        """Bytes of the latents and the index buffers."""
        index = sum(b.nbytes for b in self.index_k_with_scale_buffer)
        return sum(self._kind_bytes()) + index

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of the index buffers, one entry per layer:
        address, bytes, bytes of one page."""
        bufs = self.index_k_with_scale_buffer
        return (
            [b.data_ptr() for b in bufs],
            [b.nbytes for b in bufs],
            [self.index_layout.row_bytes for _ in bufs],
        )

"""MambaPool: per-request recurrent state (conv windows and SSM state) of linear-attention layers.

SGLang's ``MambaPool`` (``mem_cache/memory_pool.py``): one slot per request rather than per
token. Every state tensor is ``[num_layers, size + 1, ...]``: layers x rows, a row being one
request's state in one layer, so a transfer op can move states row by row (``state_tensors``).
"""

from __future__ import annotations

import torch

from hicache.checks import check_int, check_unsupported_flag
from hicache.devices import canonical_device
from hicache.pools.device_pool import LayerTransferCounter, checked_counter
from hicache.pools.kv_ops import GB
from hicache.pools.mamba_params import MambaStateParams
from hicache.pools.mamba_slots import MambaSlots, index_tensor
from hicache.pools.mamba_state import MambaSpeculativeState, MambaState, StateTensorInfo


class MambaPool:
    """States of ``size`` requests; slot 0 pads (dummy writes of padded batches land there).

    Parameters (keyword-only, as SGLang's)
    ----------
    size : usable slots ``1 .. size`` (int >= 1).
    cache_params : :class:`MambaStateParams` (layers, shapes, dtypes).
    device : where the states live.
    spec_state_size : rows of the speculative buffers are ``spec_state_size + 1`` (default
        ``size``); only used with ``speculative_num_draft_tokens``.
    enable_memory_saver : accepted for SGLang's signature; only ``False`` (no memory saver).
    speculative_num_draft_tokens : None, or the draft tokens per request (int >= 1): the state is
        then a :class:`MambaSpeculativeState` with its intermediate buffers.

    ``alloc`` zeroes the conv and temporal states it hands out (not the speculative buffers,
    which verification overwrites) and returns a 1-D int64 tensor on ``device``, as SGLang's.
    Index arguments are 1-D int64 (or int32, as ``get_mamba_indices`` gives) tensors of
    allocated slots;
    bad ones raise ``TypeError`` / ``ValueError`` / ``IndexError`` naming the argument, before
    any change. Where SGLang asserts on exhaustion, ``alloc`` / ``fork_from`` return None.
    """

    State = MambaState
    SpeculativeState = MambaSpeculativeState

    def __init__(
        self,
        *,
        size: int,
        cache_params: MambaStateParams,
        device: torch.device | str,
        spec_state_size: int | None = None,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: int | None = None,
    ) -> None:
        if not isinstance(cache_params, MambaStateParams):
            raise TypeError(
                f"cache_params must be a MambaStateParams, got {type(cache_params).__name__}"
            )
        check_unsupported_flag("enable_memory_saver", enable_memory_saver)
        self._slots = MambaSlots(size)
        self.size = size
        self.spec_state_size = size if spec_state_size is None else spec_state_size
        check_int("spec_state_size", self.spec_state_size, minimum=1)
        if speculative_num_draft_tokens is not None:
            check_int("speculative_num_draft_tokens", speculative_num_draft_tokens, minimum=1)
        self.device = canonical_device(device)
        self.cache_params = cache_params
        self.num_mamba_layers = len(cache_params.layers)
        self.speculative_num_draft_tokens = speculative_num_draft_tokens
        self.layer_transfer_counter: LayerTransferCounter | None = None
        self.mamba_cache = self._new_state()

    def _new_state(self) -> MambaState:
        params, draft = self.cache_params, self.speculative_num_draft_tokens
        conv = [self._zeros(self.size, s, params.conv_dtype) for s in params.shape.conv]
        temporal = self._zeros(self.size, params.shape.temporal, params.temporal_dtype)
        if draft is None:
            return MambaState(conv=conv, temporal=temporal)
        return MambaSpeculativeState(
            conv=conv,
            temporal=temporal,
            intermediate_ssm=self._zeros(
                self.spec_state_size, (draft, *params.shape.temporal), params.temporal_dtype
            ),
            intermediate_conv_window=[
                self._zeros(self.spec_state_size, (draft, *s), params.conv_dtype)
                for s in params.shape.conv
            ],
        )

    def _zeros(self, rows: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """``[num_layers, rows + 1, *shape]`` zeros (row 0 pads)."""
        size = (self.num_mamba_layers, rows + 1, *shape)
        return torch.zeros(size, dtype=dtype, device=self.device)

    # -- layers ------------------------------------------------------------------------------

    def register_layer_transfer_counter(self, counter: LayerTransferCounter | None) -> None:
        """Make :meth:`mamba2_layer_cache` first call ``counter.wait_until(model layer id)``
        (None: no waits)."""
        self.layer_transfer_counter = checked_counter(counter)

    def mamba2_layer_cache(self, layer_id: int) -> MambaState:
        """Pool layer ``layer_id``'s state (views; model layer ``cache_params.layers[layer_id]``),
        once the registered counter says that model layer is loaded."""
        check_int("layer_id", layer_id)
        if layer_id >= self.num_mamba_layers:
            raise IndexError(f"layer_id must be in [0, {self.num_mamba_layers}), got {layer_id}")
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(self.cache_params.layers[layer_id])
        return self.mamba_cache.at_layer_idx(layer_id)

    def get_speculative_mamba2_params_all_layers(self) -> MambaSpeculativeState:
        """The whole speculative state; ``ValueError`` if built without draft tokens."""
        if not isinstance(self.mamba_cache, MambaSpeculativeState):
            raise ValueError("this MambaPool has no speculative state (no draft tokens)")
        return self.mamba_cache

    # -- slots -------------------------------------------------------------------------------

    def available_size(self) -> int:
        return self._slots.available_size()

    def is_allocated(self, slot: int) -> bool:
        """Whether slot ``slot`` is handed out (allocated and not yet freed)."""
        return self._slots.is_allocated(slot)

    def check_allocated(self, name: str, slots: list[int]) -> None:
        """``IndexError`` / ``ValueError`` naming ``name`` unless ``slots`` are distinct
        allocated slots (changes nothing)."""
        self._slots.check_values(name, slots)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (1-D int64 on ``device``) whose conv and temporal states are
        zeroed, or None (nothing taken) when fewer are free."""
        slots = self._slots.take(need_size)
        if slots is None:
            return None
        index = index_tensor(slots, self.device)
        for t in self._row_tensors():
            t.index_fill_(1, index, 0)
        return index

    def free(self, free_index: torch.Tensor) -> None:
        """Give back distinct allocated slots (1-D int64 or int32 tensor, any device; values are
        read on the CPU). Empty: nothing happens."""
        self._slots.release(self._slots.allocated("free_index", free_index))

    def clear(self) -> None:
        """Every slot free (states are not cleared: ``alloc`` zeroes them)."""
        self._slots.clear()

    def copy_from(self, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
        """Conv and temporal state of slot ``src_index[i]`` copied to ``dst_index[i]`` in every
        layer. Both are 1-D int64 (or int32) tensors of one length, of allocated slots,
        ``dst_index`` without repeats (checked for CPU tensors; CUDA ones only with
        ``HICACHE_CHECK_DEVICE_INDICES``)."""
        self._slots.check_if_visible("src_index", src_index, distinct=False)
        self._slots.check_if_visible("dst_index", dst_index, distinct=True)
        if src_index.numel() != dst_index.numel():
            raise ValueError(
                f"src_index and dst_index differ in length: {src_index.numel()} vs "
                f"{dst_index.numel()}"
            )
        src, dst = src_index.to(self.device), dst_index.to(self.device)
        for t in self._row_tensors():
            t[:, dst] = t[:, src]

    def fork_from(self, src_index: torch.Tensor) -> torch.Tensor | None:
        """New slots holding copies of the states of ``src_index`` (checked as in
        :meth:`copy_from`), or None (nothing taken) when too few are free."""
        self._slots.check_if_visible("src_index", src_index, distinct=False)
        dst_index = self.alloc(src_index.numel())
        if dst_index is not None:
            self.copy_from(src_index, dst_index)
        return dst_index

    # -- description for transfers and memory accounting -------------------------------------

    def _row_tensors(self) -> list[torch.Tensor]:
        """The per-request state tensors (conv ones, then temporal): no speculative buffers."""
        return [*self.mamba_cache.conv, self.mamba_cache.temporal]

    @property
    def state_tensors(self) -> list[StateTensorInfo]:
        """Each per-request state tensor ``[num_layers, size + 1, ...]`` with its bytes per row
        (one request, one layer): what a transfer op moves. Speculative buffers excluded."""
        names = [f"conv{i}" for i in range(len(self.mamba_cache.conv))] + ["temporal"]
        return [
            StateTensorInfo(name, t, t[0, 0].nbytes)
            for name, t in zip(names, self._row_tensors(), strict=True)
        ]

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        """``[state tensor][layer]`` views ``[size + 1, ...]`` whose dim 0 is the slot."""
        return [list(t.unbind(0)) for t in self._row_tensors()]

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of every layer of every state tensor (tensor
        major, then layer, as SGLang): what a transfer engine registers. ``item_lens`` are
        bytes per slot. Speculative buffers are not included."""
        layers = [buf for bufs in self.row_buffers for buf in bufs]
        return (
            [b.data_ptr() for b in layers],
            [b.nbytes for b in layers],
            [b[0].nbytes for b in layers],
        )

    def get_state_dim_per_tensor(self) -> list[int]:
        """The tensor-parallel sliceable dim (the first per-slot dim: conv ``dim``, temporal
        ``heads``) of each entry of :meth:`get_contiguous_buf_infos`."""
        return [buf.shape[1] for bufs in self.row_buffers for buf in bufs]

    def mem_usage_bytes(self) -> int:
        """Bytes of every state tensor, speculative buffers included."""
        return self.mamba_cache.mem_usage_bytes()

    @property
    def mem_usage(self) -> float:
        """:meth:`mem_usage_bytes` in GB (2**30 bytes), as SGLang's attribute."""
        return self.mem_usage_bytes() / GB

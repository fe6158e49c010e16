"""Whole-pool operations every device KV pool has, over its ``row_buffers`` (a mixin of
:class:`hicache.pools.device_pool.KVPool`): slot moves, the CPU offload copy, buffer infos and
sizes, named as in SGLang's ``memory_pool.py``."""

from __future__ import annotations

from typing import Any

import torch

from hicache import env
from hicache.devices import is_cuda
from hicache.kernels.move_kv import (
    MoveTable,
    build_move_table,
    move_rows_native,
    move_rows_triton,
)

GB = 1 << 30  # SGLang logs pool sizes in GiB and calls them GB
CPU_OFFLOADING_CHUNK_SIZE = 8192  # tokens per copy of get_cpu_copy / load_cpu_copy (SGLang's)
CpuCopy = list[list[list[torch.Tensor]]]  # [layer][chunk][buffer_kind], tensors on the CPU


class KVPoolOps:
    """``move_kv_cache``, ``get_cpu_copy``/``load_cpu_copy``, ``get_contiguous_buf_infos``,
    ``get_state_buf_infos``, ``get_kv_size_bytes``, ``mem_usage``: each covers every buffer of
    ``row_buffers`` (``[buffer_kind][layer]``, dim 0 the token slot)."""

    layer_num: int
    page_size: int
    size: int
    device: torch.device
    enable_kv_cache_copy: bool
    _move_table: MoveTable | None
    cpu_offloading_chunk_size: int = CPU_OFFLOADING_CHUNK_SIZE  # SGLang's attribute

    @property
    def num_slots(self) -> int:
        """Rows of each layer buffer: ``size + page_size``."""
        return self.size + self.page_size

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        raise NotImplementedError

    def _init_kv_copy(self) -> None:
        """Choose the move path; with ``enable_kv_cache_copy`` build its tables and compile the
        kernel now (a move of the padding slot 0 onto itself), else at the first move."""
        self.use_native_move_kv_cache = env.native_move_kv_cache() or not (
            is_cuda(self.device) or env.ENV.triton_interpret
        )
        self._move_table = None
        if self.enable_kv_cache_copy and not self.use_native_move_kv_cache:
            zero = torch.zeros(1, dtype=torch.int64, device=self.device)
            move_rows_triton(self._table(), zero, zero)

    def _table(self) -> MoveTable:
        if self._move_table is None:
            self._move_table = build_move_table(self._flat_row_buffers())
        return self._move_table

    def _chunks(self, indices: torch.Tensor) -> list[torch.Tensor]:
        return list(indices.split(self.cpu_offloading_chunk_size))

    def _flat_row_buffers(self) -> list[torch.Tensor]:
        return [buf for kind in self.row_buffers for buf in kind]

    def _check_loc(self, loc: Any, name: str = "loc") -> None:
        """``TypeError`` unless a 1-D int64/int32 tensor, ``ValueError`` for a slot outside
        ``[0, size + page_size)`` (CUDA tensors only with ``HICACHE_CHECK_DEVICE_INDICES``)."""
        if not isinstance(loc, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(loc).__name__}")
        if loc.dtype not in (torch.int64, torch.int32) or loc.dim() != 1:
            raise TypeError(
                f"{name} must be a 1-D int64 (or int32) tensor, got {loc.dtype} {tuple(loc.shape)}"
            )
        if loc.numel() == 0 or (loc.device.type != "cpu" and not env.device_indices_checked()):
            return
        lo, hi = int(loc.min()), int(loc.max())
        if lo < 0 or hi >= self.num_slots:
            raise ValueError(
                f"{name} must lie in [0, {self.num_slots}), got values in [{lo}, {hi}]"
            )

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy slot ``src_loc[i]`` to ``tgt_loc[i]`` in every row buffer of every layer.

        Parameters
        ----------
        tgt_loc, src_loc : equally long 1-D int64 (or int32) tensors of slots in
            ``[0, size + page_size)`` on ``device``; ``tgt_loc`` should be distinct.

        Every source is read before any target is written, so the sets may overlap (as
        ``t[tgt] = t.clone()[src]``). On CUDA (and under ``TRITON_INTERPRET``) one Triton launch
        moves every buffer; on the CPU, or with ``HICACHE_NATIVE_MOVE_KV_CACHE=1`` or
        ``use_native_move_kv_cache = True``, torch indexing. Asynchronous on CUDA (current
        stream). ``TypeError``/``ValueError`` before anything moves on a bad argument.
        """
        for name, loc in (("tgt_loc", tgt_loc), ("src_loc", src_loc)):
            self._check_loc(loc, name)
            if loc.device != self.device:
                raise ValueError(f"{name} must be on {self.device}, got {loc.device}")
        if tgt_loc.numel() != src_loc.numel():
            raise ValueError(
                f"tgt_loc and src_loc must be equally long, got {tgt_loc.numel()} "
                f"and {src_loc.numel()}"
            )
        if self.use_native_move_kv_cache:
            move_rows_native(self._flat_row_buffers(), tgt_loc, src_loc)
        else:
            move_rows_triton(self._table(), tgt_loc, src_loc)

    def get_cpu_copy(self, indices: torch.Tensor) -> CpuCopy:
        """Slots ``indices`` of every row buffer, copied to the CPU, ``[layer][chunk][kind]``
        tensors of up to ``cpu_offloading_chunk_size`` rows (SGLang's offload before it
        releases device memory). Waits for the device before and after."""
        self._check_loc(indices, "indices")
        _sync(self.device)
        copy = [
            [[kind[layer][chunk].to("cpu", non_blocking=True) for kind in self.row_buffers]
             for chunk in self._chunks(indices)]
            for layer in range(self.layer_num)
        ]  # fmt: skip
        _sync(self.device)
        return copy

    def load_cpu_copy(self, kv_cache_cpu: CpuCopy, indices: torch.Tensor) -> None:
        """Write back ``kv_cache_cpu`` (from :meth:`get_cpu_copy` of the same ``indices``) at
        ``indices``; shapes and dtypes are checked before anything is written."""
        self.write_cpu_copy(kv_cache_cpu, self.check_cpu_copy(kv_cache_cpu, indices))

    def check_cpu_copy(self, kv_cache_cpu: Any, indices: torch.Tensor) -> list[torch.Tensor]:
        """Every check of :meth:`load_cpu_copy` (nothing written); the chunks of ``indices`` to
        pass to :meth:`write_cpu_copy` (a composite pool checks all its pools before writing)."""
        self._check_loc(indices, "indices")
        chunks = self._chunks(indices)
        self._check_cpu_copy(kv_cache_cpu, chunks)
        return chunks

    def write_cpu_copy(self, kv_cache_cpu: CpuCopy, chunks: list[torch.Tensor]) -> None:
        """The write half of :meth:`load_cpu_copy`, after :meth:`check_cpu_copy`."""
        _sync(self.device)
        for layer, per_chunk in enumerate(kv_cache_cpu):
            for chunk, tensors in zip(chunks, per_chunk, strict=True):
                for kind, cpu in zip(self.row_buffers, tensors, strict=True):
                    kind[layer][chunk] = cpu.to(self.device, non_blocking=True)
        _sync(self.device)

    def _check_cpu_copy(self, kv_cache_cpu: Any, chunks: list[torch.Tensor]) -> None:
        kinds = len(self.row_buffers)
        if not isinstance(kv_cache_cpu, list) or len(kv_cache_cpu) != self.layer_num:
            raise ValueError(f"kv_cache_cpu must be a list of {self.layer_num} layers")
        for layer, per_chunk in enumerate(kv_cache_cpu):
            if not isinstance(per_chunk, list) or len(per_chunk) != len(chunks):
                raise ValueError(f"kv_cache_cpu[{layer}] must hold {len(chunks)} chunks")
            for chunk, tensors in zip(chunks, per_chunk, strict=True):
                if not isinstance(tensors, list) or len(tensors) != kinds:
                    raise ValueError(f"kv_cache_cpu[{layer}] chunks must hold {kinds} tensors")
                for kind, cpu in zip(self.row_buffers, tensors, strict=True):
                    want = (chunk.numel(), *kind[layer].shape[1:])
                    ok = isinstance(cpu, torch.Tensor) and cpu.dtype == kind[layer].dtype
                    if not ok or tuple(cpu.shape) != want:
                        raise ValueError(
                            f"kv_cache_cpu[{layer}] tensors must be {kind[layer].dtype} "
                            f"of shape {want}, as get_cpu_copy(indices) returns them"
                        )

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` per buffer of ``row_buffers``, kind-major
        (all K layers, then all V, then any further kinds): address, bytes of the whole
        ``[size + page_size, ...]`` buffer, bytes of one page (``page_size`` rows), as SGLang
        registers them for KV transfer."""
        bufs = self._flat_row_buffers()
        return (
            [b.data_ptr() for b in bufs],
            [b.numel() * b.element_size() for b in bufs],
            [b[0].numel() * b.element_size() * self.page_size for b in bufs],
        )

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """State buffers beside the KV (pools with per-request state add theirs): none here."""
        return [], [], []

    def _kind_bytes(self) -> list[int]:
        return [sum(b.numel() * b.element_size() for b in kind) for kind in self.row_buffers]

    def get_kv_size_bytes(self) -> int | tuple[int, int]:
        """Bytes of every row buffer (MHA pools return ``(K bytes, V bytes)``)."""
        return sum(self._kind_bytes())

    @property
    def mem_usage(self) -> float:
        """GB (GiB, as SGLang logs it) of every row buffer."""
        size = self.get_kv_size_bytes()
        return (sum(size) if isinstance(size, tuple) else size) / GB


def _sync(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)

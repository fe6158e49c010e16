"""HybridReqToTokenPool: request rows that also hold a Mamba state slot (hybrid models).

SGLang's ``HybridReqToTokenPool``: every allocated row maps to the state slot of its request
(``req_index_to_mamba_index_mapping``) and, with ``enable_mamba_extra_buffer``, to its ping-pong
track slots. Request attributes read and written: see ``hicache/pools/mamba_req.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hicache.checks import check_int, check_slot_indices
from hicache.devices import canonical_device
from hicache.pools.device_pool import LayerTransferCounter
from hicache.pools.mamba_params import MambaStateParams
from hicache.pools.mamba_pool import MambaPool
from hicache.pools.mamba_req import Held, read_held
from hicache.pools.mamba_state import MambaSpeculativeState, MambaState
from hicache.pools.req_to_token import ReqToTokenPool

ROW_DTYPES = (torch.int64, torch.int32)


class HybridReqToTokenPool(ReqToTokenPool):
    """``ReqToTokenPool`` whose rows carry Mamba state slots of ``mamba_pool``.

    Parameters (keyword-only, as SGLang's)
    ----------
    size, max_context_len, device : as :class:`ReqToTokenPool`.
    mamba_size : state slots of ``mamba_pool`` (int >= 1).
    cache_params : :class:`MambaStateParams`.
    enable_mamba_extra_buffer : give each request ping-pong track slots (2, or 1 with
        speculative decoding, as SGLang 0.5.9) besides its state slot.
    mamba_spec_state_size, enable_memory_saver, speculative_num_draft_tokens : passed to
        :class:`MambaPool` (``spec_state_size``, ...).

    A request's slots belong to the request: ``free(rows, free_mamba_cache=False)`` keeps them
    on it (chunked prefill), and the next ``alloc`` reuses them. Exhaustion returns None with
    nothing taken. Bad arguments raise before any change, naming the argument.
    """

    def __init__(
        self,
        *,
        size: int,
        mamba_size: int,
        max_context_len: int,
        device: torch.device | str,
        cache_params: MambaStateParams,
        enable_mamba_extra_buffer: bool = False,
        mamba_spec_state_size: int | None = None,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: int | None = None,
    ) -> None:
        check_int("size", size, minimum=1)
        if not isinstance(enable_mamba_extra_buffer, bool):
            raise TypeError(
                f"enable_mamba_extra_buffer must be a bool, got {enable_mamba_extra_buffer!r}"
            )
        self.enable_mamba_extra_buffer = enable_mamba_extra_buffer
        self.mamba_ping_pong_track_buffer_size = 2 if speculative_num_draft_tokens is None else 1
        self.mamba_pool = MambaPool(
            size=mamba_size,
            cache_params=cache_params,
            device=device,
            spec_state_size=mamba_spec_state_size,
            enable_memory_saver=enable_memory_saver,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
        )
        self.mamba_map = {layer: i for i, layer in enumerate(cache_params.layers)}
        dev = canonical_device(device)
        self.req_index_to_mamba_index_mapping = torch.zeros(size, dtype=torch.int32, device=dev)
        if enable_mamba_extra_buffer:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (size, self.mamba_ping_pong_track_buffer_size), dtype=torch.int32, device=dev
            )
        # Row -> [state slot, *track slots] it maps (None once free_mamba_cache released it);
        # slot -> the live row mapping it.
        self._row_slots: dict[int, list[int | None]] = {}
        self._slot_row: dict[int, int] = {}
        super().__init__(size, max_context_len, device)  # calls clear()

    @property
    def _track_size(self) -> int | None:
        return self.mamba_ping_pong_track_buffer_size if self.enable_mamba_extra_buffer else None

    def alloc(self, need_size: int, reqs: Sequence[Any] | None = None) -> list[int] | None:
        """Rows for ``reqs`` (one each: ``need_size == len(reqs)``), each request's state slot
        (kept from ``req.mamba_pool_idx`` when set, else a new zeroed one) and, with the extra
        buffer, its track slots (kept or new); or None, with nothing taken, when rows or slots
        run out.

        Sets ``req.req_pool_idx`` (the row) and, for new slots, ``req.mamba_pool_idx`` (0-d
        int64 tensor), ``req.mamba_ping_pong_track_buffer`` (1-D int64) and
        ``req.mamba_next_track_idx = 0``. Kept slots must be allocated and mapped by no live
        row (``ValueError``)."""
        n = check_int("need_size", need_size)
        held = self._check_reqs(n, reqs)
        track = self._track_size or 0
        need = sum(h.state is None for h in held) + track * sum(h.track is None for h in held)
        if n > self.available_size() or need > self.mamba_pool.available_size():
            return None
        rows = super().alloc(n)
        fresh = self.mamba_pool.alloc(need)
        assert rows is not None and fresh is not None, "availability was checked above"
        fresh_ids = iter(fresh.tolist())
        for row, req, h in zip(rows, reqs or (), held, strict=True):
            self._bind(row, req, h, fresh_ids)
        return rows

    def _check_reqs(self, n: int, reqs: Sequence[Any] | None) -> list[Held]:
        if reqs is None or isinstance(reqs, (str, bytes)) or not isinstance(reqs, Sequence):
            raise TypeError(f"reqs must be a list of requests (one per row), got {reqs!r}")
        if len(reqs) != n:
            raise ValueError(f"reqs must hold need_size={n} requests, got {len(reqs)}")
        held = [read_held(r, f"reqs[{i}]", self._track_size) for i, r in enumerate(reqs)]
        kept = [s for h in held for s in [h.state, *(h.track or ())] if s is not None]
        self.mamba_pool.check_allocated("reqs' kept slots", kept)
        mapped = {s: self._slot_row[s] for s in kept if s in self._slot_row}
        if mapped:
            raise ValueError(f"reqs hold slots that live rows map (slot: row): {mapped}")
        return held

    def _bind(self, row: int, req: Any, held: Held, fresh: Any) -> None:
        """Give ``req`` row ``row`` and its slots (``fresh`` yields the new ones)."""
        dev = self.mamba_pool.device
        state = held.state if held.state is not None else next(fresh)
        req.req_pool_idx = row
        if held.state is None:
            req.mamba_pool_idx = torch.tensor(state, dtype=torch.int64, device=dev)
        self.req_index_to_mamba_index_mapping[row] = state
        slots: list[int | None] = [state]
        if self._track_size is not None:
            track = held.track or [next(fresh) for _ in range(self._track_size)]
            if held.track is None:
                req.mamba_ping_pong_track_buffer = torch.tensor(
                    track, dtype=torch.int64, device=dev
                )
                req.mamba_next_track_idx = 0
            self.req_index_to_mamba_ping_pong_track_buffer_mapping[row] = torch.tensor(
                track, dtype=torch.int32
            )
            slots += track
        self._row_slots[row] = slots
        self._slot_row.update((s, row) for s in slots if s is not None)

    def free(
        self,
        free_index: int | list[int],
        free_mamba_cache: bool = True,
        mamba_ping_pong_track_buffer_to_keep: int | None = None,
    ) -> None:
        """Free rows ``free_index``; with ``free_mamba_cache`` also the slots they map (state
        and track slots but the one at ``mamba_ping_pong_track_buffer_to_keep``, which the
        caller then owns), else the slots stay with the requests. Callers drop their requests'
        references to freed slots (``free_mamba_cache(req)`` does it for one request)."""
        keep = self._check_keep(mamba_ping_pong_track_buffer_to_keep)
        rows = self._checked_rows(free_index)
        slots = [s for r in rows for s in self._slots_to_free(r, keep)] if free_mamba_cache else []
        self.mamba_pool.check_allocated("the rows' state slots", slots)
        super().free(rows)
        for r in rows:
            for s in filter(None, self._row_slots.pop(r)):  # slots are >= 1
                del self._slot_row[s]
        self._free_slots(slots)

    def _free_slots(self, slots: list[int]) -> None:
        if slots:
            self.mamba_pool.free(torch.tensor(slots, dtype=torch.int64))

    def _slots_to_free(self, row: int, keep: int | None) -> list[int]:
        slots = self._row_slots[row]
        return [s for i, s in enumerate(slots) if s is not None and (keep is None or i != 1 + keep)]

    def _check_keep(self, keep: object) -> int | None:
        if keep is None:
            return None
        if not self.enable_mamba_extra_buffer:
            raise ValueError("mamba_ping_pong_track_buffer_to_keep needs enable_mamba_extra_buffer")
        size = self.mamba_ping_pong_track_buffer_size
        check_int("mamba_ping_pong_track_buffer_to_keep", keep)
        assert isinstance(keep, int)
        if keep >= size:
            raise ValueError(
                f"mamba_ping_pong_track_buffer_to_keep must be in [0, {size}), got {keep}"
            )
        return keep

    def free_mamba_cache(
        self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free ``req``'s state slot and (extra buffer) its track slots but the one at
        ``mamba_ping_pong_track_buffer_to_keep`` (then the caller's), and clear those attributes
        of ``req``; its row, if live, stays. ``ValueError`` if ``req.mamba_pool_idx`` is None
        (double free) or a slot is not allocated."""
        keep = self._check_keep(mamba_ping_pong_track_buffer_to_keep)
        held = read_held(req, "req", self._track_size)
        if held.state is None:
            raise ValueError("req.mamba_pool_idx is None: its state was freed already")
        track = held.track or []
        slots = [held.state] + [s for i, s in enumerate(track) if i != keep]
        self.mamba_pool.check_allocated("req's slots", slots)
        self._free_slots(slots)
        for s in [held.state, *track]:
            self._forget(s)
        req.mamba_pool_idx = None
        if self.enable_mamba_extra_buffer:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def _forget(self, slot: int) -> None:
        """Unmap ``slot`` from the live row mapping it, if any."""
        row = self._slot_row.pop(slot, None)
        if row is not None:
            slots = self._row_slots[row]
            slots[slots.index(slot)] = None

    def get_mamba_indices(self, req_indices: torch.Tensor | int) -> torch.Tensor:
        """State slots (int32, on ``device``, shaped as ``req_indices``) of rows
        ``req_indices``: a row id (a 0-d result, as SGLang's callers pass ``req.req_pool_idx``)
        or a 1-D int64/int32 tensor of them."""
        if isinstance(req_indices, torch.Tensor):
            check_slot_indices("req_indices", req_indices, self.size, ROW_DTYPES)
            return self.req_index_to_mamba_index_mapping[req_indices.to(self.device)]
        row = check_int("req_indices", req_indices)
        if row >= self.size:
            raise IndexError(f"req_indices must lie in [0, {self.size}), got {row}")
        return self.req_index_to_mamba_index_mapping[row]

    def state_slot(self, row: int) -> int | None:
        """The state slot live row ``row`` maps (read on the host, no device sync), or None
        once ``free_mamba_cache`` released it. ``ValueError`` naming ``row`` unless allocated."""
        if not self.is_allocated(check_int("row", row)):
            raise ValueError(f"row {row} is not an allocated row")
        return self._row_slots[row][0]

    def track_slot(self, row: int, idx: int) -> int:
        """Track slot ``idx`` of live row ``row`` (read on the host, no device sync).
        ``ValueError`` without the extra buffer, for a row not allocated, an ``idx`` out of
        range or a track slot already released."""
        if not self.enable_mamba_extra_buffer:
            raise ValueError("track_slot needs enable_mamba_extra_buffer")
        if not self.is_allocated(check_int("row", row)):
            raise ValueError(f"row {row} is not an allocated row")
        size = self.mamba_ping_pong_track_buffer_size
        if check_int("idx", idx) >= size:
            raise ValueError(f"idx must be in [0, {size}), got {idx}")
        slot = self._row_slots[row][1 + idx]
        if slot is None:
            raise ValueError(f"row {row}'s track slot {idx} was released")
        return slot

    def get_mamba_ping_pong_other_idx(self, mamba_next_track_idx: int) -> int:
        """The other track index (``1 - idx``) with two track slots, ``idx`` itself with one."""
        size = self.mamba_ping_pong_track_buffer_size
        if check_int("mamba_next_track_idx", mamba_next_track_idx) >= size:
            raise ValueError(
                f"mamba_next_track_idx must be in [0, {size}), got {mamba_next_track_idx}"
            )
        return 1 - mamba_next_track_idx if size == 2 else mamba_next_track_idx

    def register_layer_transfer_counter(self, counter: LayerTransferCounter | None) -> None:
        """Make :meth:`mamba2_layer_cache` wait on ``counter.wait_until(layer_id)`` first."""
        self.mamba_pool.register_layer_transfer_counter(counter)

    def mamba2_layer_cache(self, layer_id: int) -> MambaState:
        """Model layer ``layer_id``'s state (views); ``ValueError`` unless it is one of
        ``cache_params.layers``."""
        check_int("layer_id", layer_id)
        if layer_id not in self.mamba_map:
            raise ValueError(f"layer_id {layer_id} is not a Mamba layer: {list(self.mamba_map)}")
        return self.mamba_pool.mamba2_layer_cache(self.mamba_map[layer_id])

    def get_speculative_mamba2_params_all_layers(self) -> MambaSpeculativeState:
        return self.mamba_pool.get_speculative_mamba2_params_all_layers()

    def clear(self) -> None:
        """Every row and every state slot free; the mappings zeroed."""
        super().clear()
        self.mamba_pool.clear()
        self._row_slots.clear()
        self._slot_row.clear()
        self.req_index_to_mamba_index_mapping.zero_()
        if self.enable_mamba_extra_buffer:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping.zero_()

"""Device KV pools (L1): per-layer buffers indexed by token slot, for MHA and MLA models.

Every layer owns its own buffer of ``size + page_size`` slots (slot 0's page pads), so the
all-layer transfer ops reach them through uint64 pointer tables on the pool's device. fp8
dtypes are stored as uint8 and viewed back in ``dtype`` by the getters.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Protocol, cast

import torch

from hicache.checks import check_int, check_unsupported_flag
from hicache.devices import canonical_device
from hicache.pools.geometry import PageGeometry
from hicache.pools.kv_ops import KVPoolOps

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class LayerTransferCounter(Protocol):
    def wait_until(self, layer_id: int) -> None: ...


def checked_counter(counter: object) -> LayerTransferCounter | None:
    """``counter`` if None (no waits: how SGLang's composite pools clear an inner pool's) or an
    object with a callable ``wait_until(layer_id)``; ``TypeError`` otherwise."""
    if counter is not None and not callable(getattr(counter, "wait_until", None)):
        raise TypeError(
            f"counter must have a wait_until(layer_id) method, got {type(counter).__name__}"
        )
    return cast(LayerTransferCounter | None, counter)


def store_dtype_of(dtype: torch.dtype) -> torch.dtype:
    """The dtype buffers are kept in: uint8 for fp8 dtypes, else ``dtype`` itself."""
    return torch.uint8 if dtype in FP8_DTYPES else dtype


def pointer_table(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """uint64 tensor of ``data_ptr()`` of each tensor, on ``device`` (for all-layer ops)."""
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64, device=device)


def geometry_mismatch(geometry: PageGeometry, device_pool: object) -> list[str]:
    """Entries ``"key: host pool X, device pool Y"`` where ``device_pool``'s ``geometry``
    differs from ``geometry`` (a host pool's); its kind alone when it is no :class:`KVPool`."""
    if isinstance(device_pool, KVPool):
        return geometry.mismatch(device_pool.geometry)
    return geometry.mismatch({"kind": type(device_pool).__name__})


class KVPool(KVPoolOps):
    """Contract shared by the device pools.

    Attributes
    ----------
    size : usable slots (``page_size .. size + page_size - 1``); slots ``[0, page_size)`` pad.
    page_size, layer_num, device : as given.
    start_layer, end_layer : the model layers this pool holds, ``end_layer`` inclusive
        (``start_layer + layer_num - 1``; a pipeline stage's share). Getters and
        ``set_kv_buffer`` take these global ids and map them to ``layer_id - start_layer``;
        the transfer side (host pools, counters) numbers layers locally, ``[0, layer_num)``.
    enable_kv_cache_copy : prepare ``move_kv_cache``'s kernel at construction (SGLang's
        flag); without it the first move prepares it.
    enable_memory_saver : SGLang's keyword, taken for its signature: only False (hicache has
        no CUDA memory saver).
    dtype : the KV dtype the model sees; ``store_dtype`` what buffers hold (uint8 for fp8).
    item_size : bytes of one token in one layer (the transfer ops' ``item_size``).
    geometry : the pool's :class:`~hicache.pools.geometry.PageGeometry` (kind, layers, dims,
        dtype, page size, device, parts, row shape and bytes), frozen and built once: what the
        host pool, the controller and the storage keys read and a pairing compares.

    Getters (``get_key_buffer`` etc.) first call the registered counter's ``wait_until(layer)``
    so attention on layer ``l`` never reads KV still being loaded; they return views in
    ``dtype``. ``set_kv_buffer`` validates shapes, dtypes, device and slot range before writing.

    Whole-pool operations (``move_kv_cache``, CPU copies, buffer infos, sizes) come from
    :class:`hicache.pools.kv_ops.KVPoolOps`, over ``row_buffers``.

    Subclasses set their dimensions, then call ``_create_buffers()`` (the one place buffers
    and pointer tables are made, so a subclass can make others without the default ones).
    """

    kind: str  # "MHA" or "MLA"
    head_num: int  # KV heads (1 for MLA)

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: Any,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_kv_cache_copy: bool = False,
        enable_memory_saver: bool = False,
    ) -> None:
        check_unsupported_flag("enable_memory_saver", enable_memory_saver)
        if not isinstance(enable_kv_cache_copy, bool):
            raise TypeError(
                f"enable_kv_cache_copy must be a bool, got {type(enable_kv_cache_copy).__name__}"
            )
        for name, value in (("size", size), ("page_size", page_size), ("layer_num", layer_num)):
            check_int(name, value, minimum=1)
        start = 0 if start_layer is None else check_int("start_layer", start_layer)
        last = start + layer_num - 1
        if end_layer is not None and check_int("end_layer", end_layer) != last:
            raise ValueError(
                f"end_layer must be start_layer + layer_num - 1 = {last} (inclusive), "
                f"got {end_layer}"
            )
        if size % page_size:
            raise ValueError(f"size must be a multiple of page_size={page_size}, got {size}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = store_dtype_of(dtype)
        self.layer_num = layer_num
        self.start_layer, self.end_layer = start, last
        self.enable_kv_cache_copy = enable_kv_cache_copy
        self.device = canonical_device(device)
        self.layer_transfer_counter: LayerTransferCounter | None = None

    def _dims(self) -> dict[str, int]:
        raise NotImplementedError

    @property
    def item_size(self) -> int:
        """Bytes of one token in one layer."""
        raise NotImplementedError

    @property
    def part_buffers(self) -> list[list[torch.Tensor]]:
        """Per-layer buffers of each part (K and V, or the MLA latent): ``[part][layer]``."""
        raise NotImplementedError

    @property
    def part_data_ptrs(self) -> list[torch.Tensor]:
        """Each part's uint64 pointer table of its layer buffers (on ``device``)."""
        raise NotImplementedError

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        """Every per-layer buffer whose dim 0 is the token slot, ``[buffer_kind][layer]``:
        ``part_buffers`` here; pools with more per-token state (scales, labels) add theirs, so
        ``move_kv_cache``, the CPU copies, buffer infos and sizes cover all of it."""
        return self.part_buffers

    def _create_buffers(self) -> None:
        """Allocate the layer buffers and their pointer tables (called once by ``__init__``)."""
        raise NotImplementedError

    @cached_property
    def geometry(self) -> PageGeometry:
        """This pool's :class:`PageGeometry`, built once (at first use, after the dims)."""
        row = self.item_size // (self.head_num * self.store_dtype.itemsize)
        return PageGeometry(
            kind=self.kind,
            layer_num=self.layer_num,
            dims=tuple(self._dims().items()),
            dtype=self.dtype,
            page_size=self.page_size,
            device=self.device,
            parts=len(self.part_buffers),
            row_shape=(self.head_num, row),
            item_size=self.item_size,
        )

    def register_layer_transfer_counter(self, counter: LayerTransferCounter | None) -> None:
        """Make every getter wait on ``counter.wait_until(layer)`` first (None: no waits;
        ``TypeError`` unless ``counter`` has a callable ``wait_until``)."""
        self.layer_transfer_counter = checked_counter(counter)

    def _new_layers(self, shape: tuple[int, ...]) -> list[torch.Tensor]:
        return [
            torch.zeros(shape, dtype=self.store_dtype, device=self.device)
            for _ in range(self.layer_num)
        ]

    def _wait_layer(self, layer_id: int) -> int:
        """Wait on the counter for global layer ``layer_id``; return its local index."""
        local = self._local_layer(layer_id)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(local)
        return local

    def _local_layer(self, layer_id: int) -> int:
        """``layer_id - start_layer``: ``TypeError``/``ValueError`` unless ``layer_id`` is an
        int in ``[start_layer, end_layer]``."""
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise TypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not self.start_layer <= layer_id <= self.end_layer:
            raise ValueError(
                f"layer_id must be in [{self.start_layer}, {self.end_layer}], got {layer_id}"
            )
        return layer_id - self.start_layer

    def check_layer(self, layer_id: int) -> None:
        """``TypeError``/``ValueError`` unless ``layer_id`` is a local layer index (an int in
        ``[0, layer_num)``), as the transfer side numbers layers."""
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise TypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not 0 <= layer_id < self.layer_num:
            raise ValueError(f"layer_id must be in [0, {self.layer_num}), got {layer_id}")

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf if self.store_dtype == self.dtype else buf.view(self.dtype)

    def _to_store(self, name: str, cache: Any, shape: tuple[int, ...]) -> torch.Tensor:
        """Validate ``cache`` against ``shape``/``dtype``/``device``; return it as stored."""
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
        if tuple(cache.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(cache.shape)}")
        fp8_input_ok = self.dtype in FP8_DTYPES and cache.dtype.is_floating_point
        if cache.dtype != self.dtype and not fp8_input_ok:
            raise TypeError(f"{name} must have dtype {self.dtype}, got {cache.dtype}")
        if cache.device != self.device:
            raise ValueError(f"{name} must be on {self.device}, got {cache.device}")
        stored: torch.Tensor = cache.to(self.dtype)
        return stored if self.store_dtype == self.dtype else stored.view(self.store_dtype)

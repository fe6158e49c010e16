"""Device KV pools made of inner pools: global layer ids routed to an inner pool's layer.

Hybrid models keep some layers' KV apart from the others' (sliding-window layers in a smaller
pool, linear-attention layers with no KV at all). A composite pool takes the model's global layer
ids and forwards each call to the inner pool (an ``MHATokenToKVPool`` / ``MLATokenToKVPool``) and
the layer index in it. The layer-transfer wait happens here, once, on the global layer id (as in
SGLang 0.5.23); the inner pools hold no counter of their own.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch

from hicache.pools.device_pool import KVPool, LayerTransferCounter, checked_counter


class LayerKVPool(Protocol):
    """The per-layer calls of an inner pool (both ``MHATokenToKVPool`` and ``MLATokenToKVPool``)."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor: ...

    def get_value_buffer(self, layer_id: int) -> torch.Tensor: ...

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def set_kv_buffer(self, *args: Any, **kwargs: Any) -> None: ...


def check_layer_ids(name: str, layer_ids: Any) -> list[int]:
    """``layer_ids`` as a non-empty list of distinct non-negative ints: ``TypeError`` /
    ``ValueError`` naming ``name`` otherwise."""
    if isinstance(layer_ids, (str, bytes)) or not hasattr(layer_ids, "__iter__"):
        raise TypeError(f"{name} must be a list of ints, got {type(layer_ids).__name__}")
    ids = list(layer_ids)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise TypeError(f"{name} must hold ints, got {ids!r}")
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise ValueError(f"{name} must be non-empty, distinct and >= 0, got {ids!r}")
    return ids


class CompositeKVPool:
    """Contract of the composite pools: ``layers_mapping`` routes a global layer id.

    Attributes
    ----------
    layers_mapping : ``{global layer id: (index in its inner pool, is_swa)}``.
    start_layer : the first layer of this pipeline stage; getters wait on the counter's layer
        ``layer_id - start_layer``.
    layer_transfer_counter : the registered counter, or None.
    size, page_size, device : the full-attention pool's slots (the allocator's), page and device.
    num_slots : ``size + page_size`` (the device slots a transfer may name; page 0 pads).
    transfer_layer_num : layers the transfer side numbers (below).

    The transfer side (the host pool's load plans, the controller's ``LayerDoneCounter``)
    numbers layers ``layer_id - start_layer`` over every global id up to the last one it knows
    (layers without KV here, linear ones, included: a load copies nothing for them), so the
    counter's layer ``l`` is exactly what a getter of global layer ``start_layer + l`` waits on.

    Getters take a global ``layer_id``: ``TypeError`` for a non-int, ``ValueError`` naming
    ``layer_id`` for an id with no KV here, then the counter's ``wait_until``, then the inner
    pool's getter (views in ``dtype``, shapes as the inner pool's).
    """

    layers_mapping: dict[int, tuple[int, bool]]
    size: int
    page_size: int
    device: torch.device

    def __init__(self, start_layer: int = 0) -> None:
        self.start_layer = start_layer
        self.layer_transfer_counter: LayerTransferCounter | None = None

    @property
    def inner_pools(self) -> list[KVPool]:
        """Every inner pool, the full-attention one first."""
        raise NotImplementedError

    @property
    def num_slots(self) -> int:
        """Device slots of the full-attention pool, ``size + page_size``."""
        return self.size + self.page_size

    @property
    def transfer_layer_num(self) -> int:
        """``1 + (the last global layer id known here) - start_layer``: ``layers_mapping``'s
        ids and :meth:`_other_layers`'."""
        return max((*self.layers_mapping, *self._other_layers())) + 1 - self.start_layer

    def _other_layers(self) -> tuple[int, ...]:
        """Global ids of the model's layers without KV that this pool knows (none here)."""
        return ()

    def inner_slots(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """The slots of allocator slots ``indices`` (int64) in each of :attr:`inner_pools`,
        in that order, each on ``indices``' device (the full pool's: ``indices`` itself)."""
        return [indices]

    def _pool_for(self, is_swa: bool) -> KVPool:
        raise NotImplementedError

    def _layer_kind(self) -> str:
        """How error messages call the layers of ``layers_mapping``."""
        return "layers with KV"

    def _route(self, layer_id: Any) -> tuple[LayerKVPool, int, bool]:
        """``(inner pool, its layer index, is_swa)`` of global ``layer_id``; no wait."""
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise TypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if layer_id not in self.layers_mapping:
            raise ValueError(
                f"layer_id {layer_id} is not one of the {self._layer_kind()}: "
                f"{sorted(self.layers_mapping)}"
            )
        index, is_swa = self.layers_mapping[layer_id]
        return cast(LayerKVPool, self._pool_for(is_swa)), index, is_swa

    def _wait_layer(self, layer_id: Any) -> tuple[LayerKVPool, int]:
        pool, index, _ = self._route(layer_id)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return pool, index

    def register_layer_transfer_counter(self, counter: LayerTransferCounter | None) -> None:
        """Make every getter wait on ``counter.wait_until(layer_id - start_layer)`` first, the
        global id (None: no waits; ``TypeError`` unless ``counter`` has a callable
        ``wait_until``). Inner pools' counters are cleared: no getter waits twice, or on an inner
        layer index."""
        self.layer_transfer_counter = checked_counter(counter)
        for pool in self.inner_pools:
            pool.layer_transfer_counter = None

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys (its inner pool's ``get_key_buffer``)."""
        pool, index = self._wait_layer(layer_id)
        return pool.get_key_buffer(index)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values (its inner pool's ``get_value_buffer``)."""
        pool, index = self._wait_layer(layer_id)
        return pool.get_value_buffer(index)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of layer ``layer_id`` (one wait)."""
        pool, index = self._wait_layer(layer_id)
        return pool.get_kv_buffer(index)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, *caches: torch.Tensor) -> None:
        """Write ``caches`` (``cache_k, cache_v`` for MHA, ``cache_kv`` for MLA: the inner
        pool's ``set_kv_buffer``) at slots ``loc`` of layer ``layer_id``; all checks first."""
        pool, index, _ = self._route(layer_id)
        pool.set_kv_buffer(index, loc, *caches)

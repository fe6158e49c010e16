"""PageGeometry: what every tier agrees on about a device pool's pages, in one frozen value.

The device pool owns it (``KVPool.geometry``, built once); the host pool, the controller and
the storage keys read it instead of keeping their own copies of page size, layers and row
bytes, and it is compared once where pools are paired (``HostKVPool`` at construction and at
each transfer, the controller's ``check_pools``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PageGeometry:
    """A device pool's page geometry.

    Attributes
    ----------
    kind : the pool's kind (``"MHA"``, ``"MLA"``, ``"MHA_FP4"``, ...): what a page's bytes mean.
    layer_num : layers the pool holds.
    dims : the kind's named dims in order (``(("head_num", 8), ("head_dim", 128), ...)``).
    dtype : the KV dtype the model sees.
    page_size : token slots per page.
    device : where the pool's buffers live.
    parts : per-layer buffers a token has in the host tier's view (K and V: 2, a latent: 1).
    row_shape : ``(heads, dim)`` of one part's token row in one layer (MLA: ``(1, kv_dim)``).
    item_size : bytes of one part's token row in one layer.
    """

    kind: str
    layer_num: int
    dims: tuple[tuple[str, int], ...]
    dtype: torch.dtype
    page_size: int
    device: torch.device
    parts: int
    row_shape: tuple[int, int]
    item_size: int

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one part over all layers (a storage object's size)."""
        return self.page_size * self.layer_num * self.item_size

    def as_dict(self) -> dict[str, object]:
        """kind, layer_num, the dims, dtype, page_size and device, in that order: the fields a
        pairing compares (``parts``, ``row_shape`` and ``item_size`` follow from them)."""
        return {
            "kind": self.kind,
            "layer_num": self.layer_num,
            **dict(self.dims),
            "dtype": self.dtype,
            "page_size": self.page_size,
            "device": self.device,
        }

    def mismatch(self, other: PageGeometry | dict[str, object]) -> list[str]:
        """Entries ``"key: host pool X, device pool Y"`` for each field where ``other`` (a
        geometry, or the fields known of something that is no KV pool) differs; none when
        the geometries are equal."""
        if other == self:
            return []
        mine = self.as_dict()
        them = other.as_dict() if isinstance(other, PageGeometry) else other
        keys = list(mine) + [k for k in them if k not in mine]
        return [
            f"{k}: host pool {mine.get(k, '-')}, device pool {them.get(k, '-')}"
            for k in keys
            if mine.get(k) != them.get(k)
        ]

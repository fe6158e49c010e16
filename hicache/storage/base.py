"""The storage contract (L3): page-level batch calls a storage backend implements.

A backend stores *page objects*: the KV bytes of one page of a host pool, one object per part
(K and V for MHA, the latent for MLA), under string keys built by ``hicache.storage.keys``.
The caller (the storage tier) hashes; a backend never does. Every call is a batch over pages:

- ``batch_exists(keys)``: the number of leading keys present (a page counts only when every one
  of its objects is), i.e. the longest present prefix, in pages.
- ``batch_get_v1(keys, host_indices)``: read page ``i`` into host slots
  ``host_indices[i * page_size : (i + 1) * page_size]``; one bool per page. A page that fails
  leaves its own host slots in an unspecified state and no other slot touched.
- ``batch_set_v1(keys, host_indices)``: write the pages from those host slots, skipping pages
  already present (write-once: a key names a whole prefix, so its bytes never change); one bool
  per page (True when the page is present afterwards).

**Errors are misses.** After construction, no call raises on a backend failure (I/O error, full
store, dead server): it logs once and reports False / 0. Wrong *arguments* (a key list and an
index tensor of different lengths, unaligned host slots) are caller bugs and raise
``TypeError``/``ValueError`` before anything is read or written. ``register_mem_pool_host``
must be called once, before any batch call; the host pool must outlive the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.storage.pages import PageIO

__all__ = ["HiCacheStorage", "HiCacheStorageExtraInfo"]


@dataclass(frozen=True)
class HiCacheStorageExtraInfo:
    """Optional per-call context (SGLang's name): ``prefix_keys``, the page keys before the
    first key of the call (a backend may use them for placement); ``extra_info`` free-form."""

    prefix_keys: tuple[str, ...] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)


class HiCacheStorage(ABC):
    """A storage backend; see the module docstring for the contract.

    Subclasses implement the three batch calls (and may override ``clear``, ``get_stats``,
    ``close``); ``self.pages`` (a ``PageIO``) gives them the bytes of each host page.
    """

    pages: PageIO | None = None

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Attach the host pool whose slots the batch calls read and write (once)."""
        if self.pages is not None:
            raise ValueError("register_mem_pool_host: a host pool is already registered")
        self.pages = PageIO(mem_pool_host)

    def page_io(self) -> PageIO:
        """The registered ``PageIO``; ``ValueError`` before ``register_mem_pool_host``."""
        if self.pages is None:
            raise ValueError("call register_mem_pool_host before any batch call")
        return self.pages

    @abstractmethod
    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many of ``keys``, from the first, are present (0 .. len(keys))."""

    @abstractmethod
    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read each page into its host slots (int64 CPU ``[len(keys) * page_size]``)."""

    @abstractmethod
    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Write each page from its host slots, skipping pages already present."""

    def clear(self) -> None:  # noqa: B027 (optional: a backend with nothing to clear)
        """Remove every object this backend can reach (tests and operators)."""

    def get_stats(self) -> dict[str, Any]:
        """Backend-specific figures (sizes, object counts); ``{}`` by default."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional: a backend holding no resources)
        """Release connections and files (idempotent); later calls are misses."""

"""The storage contract (L3): page-level batch calls a storage backend implements.

A backend stores *page objects*: the KV bytes of one page of a host pool, one object per part
(K and V for MHA, the latent for MLA), under string keys built by ``hicache.backends.keys``.
The caller (the storage tier) hashes; a backend never does. Every call is a batch over pages:

- ``batch_exists(keys)``: the number of leading keys present (a page counts only when every one
  of its objects is), i.e. the longest present prefix, in pages.
- ``batch_get_v1(keys, host_indices)``: read page ``i`` into host slots
  ``host_indices[i * page_size : (i + 1) * page_size]``; one bool per page, True only for a page
  whose every object passed its trailer's check (``page_sum``). A page that fails leaves its own
  host slots in an unspecified state and no other slot touched.
- ``batch_set_v1(keys, host_indices)``: write the pages from those host slots, skipping pages
  already present (write-once: a key names a whole prefix, so its bytes never change); one bool
  per page (True when the page is present afterwards).

**Errors are misses.** After construction, no call raises on a backend failure (I/O error, full
store, dead server): it logs once and reports False / 0. Wrong *arguments* (a key list and an
index tensor of different lengths, unaligned host slots) are caller bugs and raise
``TypeError``/``ValueError`` before anything is read or written. ``register_mem_pool_host``
must be called once, before any batch call; the host pool must outlive the backend.

**Evictions are reported** where the backend sees them: a backend that removes pages on its own
(the file store's LRU, a corrupt object) calls ``on_evict`` (when set) with their page keys,
from the thread that removed them. ``medium`` names the backend in KV events (SGLang's
``StorageMedium``: ``DISK`` for the file store, ``EXTERNAL`` otherwise).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.backends.composite_pages import page_io_of
from hicache.backends.faults import FaultLog
from hicache.backends.keys import check_keys
from hicache.backends.pages import PageIO

__all__ = ["HiCacheStorage", "HiCacheStorageExtraInfo", "PageStore"]

logger = logging.getLogger(__name__)


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
    medium: str = "EXTERNAL"
    on_evict: Callable[[list[str]], None] | None = None

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Attach the host pool whose slots the batch calls read and write (once);
        ``TypeError`` unless it is a ``HostKVPool``, a ``HybridKVPoolHost`` or a
        ``MambaPoolHost`` (``composite_pages.page_io_of``)."""
        pages = page_io_of(mem_pool_host)
        if self.pages is not None:
            raise ValueError("register_mem_pool_host: a host pool is already registered")
        self.pages = pages

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


class PageStore(HiCacheStorage):
    """A backend that keeps the pages itself (``file``, ``memory``, ``mooncake``): the batch
    calls' one prologue, written here once.

    Each batch call checks its arguments (``keys.check_keys``, ``PageIO.page_slots``: raises,
    nothing touched), answers a closed store (``closed``, set by ``close``) or an empty batch
    with misses, and only then runs the subclass's ``_count_present`` / ``_read_pages`` /
    ``_write_pages`` with the checked ``PageIO`` and each page's first host slot.

    Its faults are counted by kind in ``faults`` (``guard.ReportsFaults``); every backend's
    reads count an object that fails its trailer's check as ``checksum_mismatch``.
    """

    closed = False

    def __init__(self, where: str) -> None:
        self.faults = FaultLog(logger, where)

    def fault_counts(self) -> dict[str, int]:
        """Faults so far by kind (``guard.ReportsFaults``)."""
        return self.faults.counts()

    def _accepted(
        self, pages: PageIO, names: list[str], slot: int, targets: list[Any], trailers: list[Any]
    ) -> bool:
        """``pages.accept`` for a page's objects ``names`` (``keys.object_keys``) read into
        ``targets``; a page that fails it is a ``checksum_mismatch`` fault (the caller removes
        its objects)."""
        if pages.accept(names, slot, targets, trailers):
            return True
        self.faults.record("checksum_mismatch", f"objects {names}: one failed its checksum")
        return False

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        pages = self.page_io()
        check_keys(keys)
        return 0 if self.closed or not keys else self._count_present(pages, keys)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._batch(keys, host_indices, self._read_pages)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._batch(keys, host_indices, self._write_pages)

    def _batch(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        pages_op: Callable[[PageIO, list[str], list[int]], list[bool]],
    ) -> list[bool]:
        """The one prologue of a page batch: checked keys and slots, then ``pages_op``
        unless the store is closed or the batch empty (all False)."""
        pages = self.page_io()
        slots = pages.page_slots(keys, host_indices)
        if self.closed or not keys:
            return [False] * len(keys)
        return pages_op(pages, keys, slots)

    @abstractmethod
    def _count_present(self, pages: PageIO, keys: list[str]) -> int:
        """``batch_exists`` on checked, non-empty ``keys``."""

    @abstractmethod
    def _read_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        """``batch_get_v1``: page ``keys[i]`` into the host page starting at ``slots[i]``."""

    @abstractmethod
    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        """``batch_set_v1``: page ``keys[i]`` from the host page starting at ``slots[i]``."""

"""MooncakeStore: the storage contract over Mooncake Store (``pip install hicache[mooncake]``).

Page ``key`` is stored as one object per host-pool part (``keys.object_keys``). Pages move
between the host pool and the store with ``batch_put_from`` / ``batch_get_into``: straight from
and into the pool's pages (zero-copy) for ``page_first``, ``page_first_direct`` and
``page_head``, through a staging block per call for ``layer_first``. Run the store as its own
``mooncake_client`` process and keep ``global_segment_size=0`` here, so pages outlive this
process and are shared by every instance using the master.

Construction probes the master over TCP (a dead master fails in ``probe_timeout_s``, not in
Mooncake's 90 s setup) and runs ``setup`` in a thread with a deadline; it raises
``ConnectionError`` when either fails. After that no call raises: a negative Mooncake code is
a miss (``get_stats()["errors"]`` counts the ones that are not plain misses).
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import numpy as np
import torch

from hicache.storage.base import HiCacheStorage, HiCacheStorageExtraInfo
from hicache.storage.keys import object_keys
from hicache.storage.mooncake_config import MooncakeConfig
from hicache.storage.pages import PageIO

__all__ = ["MooncakeStore"]

logger = logging.getLogger(__name__)

# Codes that only mean "not there (now)": object not found, has a lease, lease expired.
_MISS_CODES = frozenset({-704, -706, -707})
_ALREADY_EXISTS = -705


def _import_store() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ImportError(
            "the mooncake storage backend needs Mooncake Store: pip install hicache[mooncake] "
            f"(mooncake-transfer-engine-non-cuda; and apt-get install libibverbs1): {exc}"
        ) from exc
    return MooncakeDistributedStore()


def _probe(config: MooncakeConfig) -> None:
    try:
        with socket.create_connection(config.master, timeout=config.probe_timeout_s):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"mooncake master {config.master_server_address} unreachable: {exc}"
        ) from exc


def _setup(store: Any, config: MooncakeConfig) -> None:
    """``store.setup`` in a daemon thread; ``ConnectionError`` unless it returns 0 in time."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(
                store.setup(
                    config.local_hostname,
                    config.metadata_server,
                    config.global_segment_size,
                    config.local_buffer_size,
                    config.protocol,
                    config.device_name,
                    config.master_server_address,
                    None,
                    tenant_id=config.tenant_id,
                )
            )
        except Exception as exc:  # reported below, in the constructing thread
            result.append(exc)

    thread = threading.Thread(target=run, name="mooncake-setup", daemon=True)
    thread.start()
    thread.join(config.setup_timeout_s)
    if not result:
        raise ConnectionError(
            f"mooncake setup with {config.master_server_address} did not finish in "
            f"{config.setup_timeout_s} s"
        )
    if result[0] != 0:
        raise ConnectionError(f"mooncake setup with {config.master_server_address}: {result[0]}")


class MooncakeStore(HiCacheStorage):
    """A Mooncake Store client; see the module docstring.

    Parameters are those of :class:`~hicache.storage.mooncake_config.MooncakeConfig`; one left
    ``None`` comes from ``HICACHE_MOONCAKE_<NAME>`` or its default. ``ImportError`` (naming
    the extra) without the package, ``TypeError``/``ValueError`` on bad settings,
    ``ConnectionError`` when the master cannot be reached or setup fails.
    """

    def __init__(
        self,
        master_server_address: str | None = None,
        metadata_server: str | None = None,
        protocol: str | None = None,
        device_name: str | None = None,
        local_hostname: str | None = None,
        global_segment_size: int | None = None,
        local_buffer_size: int | None = None,
        tenant_id: str | None = None,
        probe_timeout_s: float | None = None,
        setup_timeout_s: float | None = None,
    ) -> None:
        given = dict(locals())
        given.pop("self")
        self.config = MooncakeConfig.resolve(given)
        store = _import_store()
        _probe(self.config)
        _setup(store, self.config)
        self._store = store
        self._lock = threading.Lock()
        self._closed = False
        self._errors = 0
        self._logged: set[str] = set()

    # -- failure handling ---------------------------------------------------------------------

    def _note(self, what: str, codes: list[int]) -> None:
        """Count and log (once per call kind and code) the codes that are not plain misses."""
        bad = sorted({c for c in codes if c < 0 and c not in _MISS_CODES})
        if not bad:
            return
        with self._lock:
            self._errors += 1
            first = [c for c in bad if f"{what}{c}" not in self._logged]
            self._logged.update(f"{what}{c}" for c in first)
        if first:
            logger.warning("mooncake %s failed with codes %s (now a miss)", what, first)

    def _fail(self, what: str, exc: Exception) -> None:
        with self._lock:
            self._errors += 1
            new = f"{what}{type(exc).__name__}" not in self._logged
            self._logged.add(f"{what}{type(exc).__name__}")
        if new:
            logger.warning("mooncake %s raised %r (now a miss)", what, exc)

    def _exist(self, okeys: list[str]) -> list[bool]:
        codes = [int(c) for c in self._store.batch_is_exist(okeys)]
        self._note("batch_is_exist", codes)
        if len(codes) != len(okeys):
            return [False] * len(okeys)
        return [c == 1 for c in codes]

    # -- the contract ---------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Attach the host pool and register its buffers with the store (RDMA needs it; TCP
        works without)."""
        super().register_mem_pool_host(mem_pool_host)
        if self._closed:
            return
        for address, size in self.page_io().regions():
            try:
                self._note("register_buffer", [int(self._store.register_buffer(address, size))])
            except Exception as exc:
                self._fail("register_buffer", exc)

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        pages = self.page_io()
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TypeError("keys must be a list of str")
        if self._closed or not keys:
            return 0
        try:
            present = self._exist([o for k in keys for o in object_keys(k, pages.parts)])
        except Exception as exc:
            self._fail("batch_exists", exc)
            return 0
        for i in range(len(keys)):
            if not all(present[i * pages.parts : (i + 1) * pages.parts]):
                return i
        return len(keys)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pages = self.page_io()
        slots = pages.page_slots(keys, host_indices)
        if self._closed or not keys:
            return [False] * len(keys)
        try:
            return self._set(pages, keys, slots)
        except Exception as exc:
            self._fail("batch_set_v1", exc)
            return [False] * len(keys)

    def _set(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        parts = pages.parts
        okeys = [o for k in keys for o in object_keys(k, parts)]
        done = self._exist(okeys)
        todo = [i for i, there in enumerate(done) if not there]
        if todo:
            if pages.zero_copy:
                ptrs = [a for s in slots for a in pages.address(s)]
            else:  # kept alive by this frame until the put has copied it
                staging = np.concatenate([a for s in slots for a in pages.source(s)])
                ptrs = [staging.ctypes.data + i * pages.object_bytes for i in range(len(okeys))]
            codes = [
                int(c)
                for c in self._store.batch_put_from(
                    [okeys[i] for i in todo],
                    [ptrs[i] for i in todo],
                    [pages.object_bytes] * len(todo),
                )
            ]
            self._note("batch_put_from", codes)
            if len(codes) == len(todo):
                for i, code in zip(todo, codes, strict=True):
                    done[i] = code in (0, _ALREADY_EXISTS)
        return [all(done[i * parts : (i + 1) * parts]) for i in range(len(keys))]

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pages = self.page_io()
        slots = pages.page_slots(keys, host_indices)
        if self._closed or not keys:
            return [False] * len(keys)
        try:
            return self._get(pages, keys, slots)
        except Exception as exc:
            self._fail("batch_get_v1", exc)
            return [False] * len(keys)

    def _get(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        parts, size = pages.parts, pages.object_bytes
        okeys = [o for k in keys for o in object_keys(k, parts)]
        if pages.zero_copy:
            staging = None
            ptrs = [a for s in slots for a in pages.address(s)]
        else:
            staging = np.empty(len(okeys) * size, np.uint8)
            ptrs = [staging.ctypes.data + i * size for i in range(len(okeys))]
        codes = [int(c) for c in self._store.batch_get_into(okeys, ptrs, [size] * len(okeys))]
        self._note("batch_get_into", codes)
        if len(codes) != len(okeys):
            return [False] * len(keys)
        ok = [all(c == size for c in codes[i * parts : (i + 1) * parts]) for i in range(len(keys))]
        if staging is not None:
            for i, slot in enumerate(slots):
                if ok[i]:
                    objs = staging[i * parts * size : (i + 1) * parts * size]
                    pages.commit(slot, [objs[p * size : (p + 1) * size] for p in range(parts)])
        return ok

    def clear(self) -> None:
        """Remove every object of the store (``remove_all(force=True)``; all tenants' pages)."""
        if self._closed:
            return
        try:
            self._note("remove_all", [min(0, int(self._store.remove_all(True)))])
        except Exception as exc:
            self._fail("clear", exc)

    def get_stats(self) -> dict[str, Any]:
        """``backend``, ``master``, ``closed`` and ``errors`` (calls that failed, not missed)."""
        with self._lock:
            errors = self._errors
        return {
            "backend": "mooncake",
            "master": self.config.master_server_address,
            "closed": self._closed,
            "errors": errors,
        }

    def close(self) -> None:
        """Close the client (idempotent); later calls are misses."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._store.close()
        except Exception as exc:
            self._fail("close", exc)

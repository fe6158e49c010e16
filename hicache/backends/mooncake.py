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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import numpy as np

from hicache.backends.base import PageStore
from hicache.backends.keys import object_keys
from hicache.backends.mooncake_config import MooncakeConfig
from hicache.backends.mooncake_setup import connect
from hicache.backends.pages import PageIO

__all__ = ["MooncakeStore"]

logger = logging.getLogger(__name__)

# Codes of a healthy store that only mean "not (now)": no space (a full store: -200,
# NO_AVAILABLE_HANDLE), object not found, has a lease, lease expired.
_MISS_CODES = frozenset({-200, -704, -706, -707})
_ALREADY_EXISTS = -705
_CLOSE_WAIT_S = 30.0  # longer than any call takes with the master gone (~4.3 s)
T = TypeVar("T")


class MooncakeStore(PageStore):
    """A Mooncake Store client; see the module docstring.

    Parameters are those of :class:`~hicache.backends.mooncake_config.MooncakeConfig`; one left
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
        self._store = connect(self.config)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
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

    def _run(self, what: str, miss: T, fn: Callable[[], T]) -> T:
        """``fn()`` while the client is open (``close`` waits for it), else ``miss``; an
        exception is logged once, counted, and becomes ``miss``."""
        with self._lock:
            if self.closed:
                return miss
            self._inflight += 1
        try:
            return fn()
        except Exception as exc:
            self._fail(what, exc)
            return miss
        finally:
            with self._lock:
                self._inflight -= 1
                self._idle.notify_all()

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
        for address, size in self.page_io().regions():
            register = partial(self._store.register_buffer, address, size)
            code = self._run("register_buffer", 0, register)
            self._note("register_buffer", [int(code)])

    def _count_present(self, pages: PageIO, keys: list[str]) -> int:
        okeys = [o for k in keys for o in object_keys(k, pages.parts)]
        present = self._run("batch_exists", [False], lambda: self._exist(okeys))
        for i in range(len(keys)):
            if not all(present[i * pages.parts : (i + 1) * pages.parts]):
                return i
        return len(keys)

    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        return self._run("batch_set_v1", [False] * len(keys), lambda: self._set(pages, keys, slots))

    @contextmanager
    def _staging(self, nbytes: int) -> Iterator[np.ndarray]:
        """A staging block registered with the store for one call (RDMA needs registered
        memory; over TCP an unregistered 1 MiB object moves ~10x slower). Empty when
        ``nbytes`` is 0 (zero-copy layouts)."""
        block = np.empty(nbytes, np.uint8)
        address = block.ctypes.data
        registered = nbytes > 0 and int(self._store.register_buffer(address, nbytes)) == 0
        try:
            yield block
        finally:
            if registered:
                self._store.unregister_buffer(address)

    def _set(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        parts, size = pages.parts, pages.object_bytes
        okeys = [o for k in keys for o in object_keys(k, parts)]
        done = self._exist(okeys)
        todo = [i for i, there in enumerate(done) if not there]
        if not todo:
            return [all(done[i * parts : (i + 1) * parts]) for i in range(len(keys))]
        with self._staging(0 if pages.zero_copy else len(okeys) * size) as staging:
            if pages.zero_copy:
                ptrs = [a for s in slots for a in pages.address(s)]
            else:
                np.concatenate([a for s in slots for a in pages.source(s)], out=staging)
                ptrs = [staging.ctypes.data + i * size for i in range(len(okeys))]
            codes = self._store.batch_put_from(
                [okeys[i] for i in todo], [ptrs[i] for i in todo], [size] * len(todo)
            )
        codes = [int(c) for c in codes]
        self._note("batch_put_from", codes)
        if len(codes) == len(todo):
            for i, code in zip(todo, codes, strict=True):
                done[i] = code in (0, _ALREADY_EXISTS)
        return [all(done[i * parts : (i + 1) * parts]) for i in range(len(keys))]

    def _read_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        return self._run("batch_get_v1", [False] * len(keys), lambda: self._get(pages, keys, slots))

    def _get(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        parts, size = pages.parts, pages.object_bytes
        okeys = [o for k in keys for o in object_keys(k, parts)]
        with self._staging(0 if pages.zero_copy else len(okeys) * size) as staging:
            if pages.zero_copy:
                ptrs = [a for s in slots for a in pages.address(s)]
            else:
                ptrs = [staging.ctypes.data + i * size for i in range(len(okeys))]
            codes = [int(c) for c in self._store.batch_get_into(okeys, ptrs, [size] * len(okeys))]
            self._note("batch_get_into", codes)
            if len(codes) != len(okeys):
                return [False] * len(keys)
            ok = [
                all(c == size for c in codes[i * parts : (i + 1) * parts]) for i in range(len(keys))
            ]
            if not pages.zero_copy:
                for i, slot in enumerate(slots):
                    if ok[i]:
                        objs = staging[i * parts * size : (i + 1) * parts * size]
                        pages.commit(slot, [objs[p * size : (p + 1) * size] for p in range(parts)])
        return ok

    def clear(self) -> None:
        """Remove every object of the store (``remove_all(force=True)``; all tenants' pages)."""
        removed = self._run("clear", 0, lambda: int(self._store.remove_all(True)))
        self._note("remove_all", [min(0, removed)])

    def failure_count(self) -> int:
        """Calls that failed (not plain misses) so far (``guard.ReportsFailures``)."""
        with self._lock:
            return self._errors

    def get_stats(self) -> dict[str, Any]:
        """``backend``, ``master``, ``closed`` and ``errors`` (calls that failed, not missed)."""
        return {
            "backend": "mooncake",
            "master": self.config.master_server_address,
            "closed": self.closed,
            "errors": self.failure_count(),
        }

    def close(self) -> None:
        """Close the client (idempotent) once the calls in flight are done (at most
        ``_CLOSE_WAIT_S``; past that it is left open rather than closed under a call); later
        calls are misses."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            idle = self._idle.wait_for(lambda: self._inflight == 0, _CLOSE_WAIT_S)
        if not idle:
            logger.warning("mooncake close: calls still in flight after %s s", _CLOSE_WAIT_S)
            return
        try:
            self._store.close()
        except Exception as exc:
            self._fail("close", exc)

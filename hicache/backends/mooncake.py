"""MooncakeStore: the storage contract over Mooncake Store (``pip install hicache[mooncake]``).

Page ``key`` is stored as one object per host-pool part (``keys.object_keys``). Pages move
between the host pool and the store with ``batch_put_from_multi_buffers`` /
``batch_get_into_multi_buffers``: the payload straight from and into the pool's pages
(zero-copy) for ``page_first``, ``page_first_direct`` and ``page_head``, through a staging block
per call for ``layer_first``, and its trailer (``page_sum``) from and into a small staging block
beside it. A page whose objects fail their trailer's check is a miss, counted and removed. Run
the store as its own ``mooncake_client`` process and keep ``global_segment_size=0`` here, so
pages outlive this process and are shared by every instance using the master.

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
        super().__init__(f"mooncake store {self.config.master_server_address}")
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
        parts, size, tail = pages.parts, pages.object_bytes, pages.trailer_bytes
        okeys = [o for k in keys for o in object_keys(k, parts)]
        done = self._exist(okeys)
        todo = [i for i, there in enumerate(done) if not there]
        if not todo:
            return [all(done[i * parts : (i + 1) * parts]) for i in range(len(keys))]
        payloads = [a for s in slots for a in pages.source(s)]
        with self._staging(len(todo) * tail + (0 if pages.zero_copy else len(okeys) * size)) as st:
            trailers = st[: len(todo) * tail].reshape(len(todo), tail)
            for row, i in zip(trailers, todo, strict=True):
                row[:] = np.frombuffer(
                    pages.trailer(okeys[i], slots[i // parts], payloads[i]), "u1"
                )
            ptrs = self._payload_ptrs(pages, slots, st, len(todo) * tail)
            if not pages.zero_copy:
                np.concatenate(payloads, out=st[len(todo) * tail :])
            codes = self._store.batch_put_from_multi_buffers(
                [okeys[i] for i in todo],
                [[ptrs[i], row.ctypes.data] for row, i in zip(trailers, todo, strict=True)],
                [[size, tail]] * len(todo),
            )
        codes = [int(c) for c in codes]
        self._note("batch_put_from_multi_buffers", codes)
        if len(codes) == len(todo):
            for i, code in zip(todo, codes, strict=True):
                done[i] = code in (0, _ALREADY_EXISTS)
        return [all(done[i * parts : (i + 1) * parts]) for i in range(len(keys))]

    @staticmethod
    def _payload_ptrs(pages: PageIO, slots: list[int], staging: np.ndarray, at: int) -> list[int]:
        """Where each object's payload is: in the pool (zero-copy), else in ``staging`` from
        byte ``at`` on, object after object."""
        if pages.zero_copy:
            return [a for s in slots for a in pages.address(s)]
        base, n = staging.ctypes.data + at, len(slots) * pages.parts
        return [base + i * pages.object_bytes for i in range(n)]

    def _read_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        return self._run("batch_get_v1", [False] * len(keys), lambda: self._get(pages, keys, slots))

    def _get(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        parts, size, tail = pages.parts, pages.object_bytes, pages.trailer_bytes
        okeys = [o for k in keys for o in object_keys(k, parts)]
        n = len(okeys)
        with self._staging(n * tail + (0 if pages.zero_copy else n * size)) as staging:
            trailers = staging[: n * tail].reshape(n, tail)
            ptrs = self._payload_ptrs(pages, slots, staging, n * tail)
            codes = self._store.batch_get_into_multi_buffers(
                okeys,
                [[p, row.ctypes.data] for p, row in zip(ptrs, trailers, strict=True)],
                [[size, tail]] * n,
            )
            codes = [int(c) for c in codes]
            self._note("batch_get_into_multi_buffers", codes)
            if len(codes) != n:
                return [False] * len(keys)
            ok = [
                all(c == size + tail for c in codes[i * parts : (i + 1) * parts])
                for i in range(len(keys))
            ]
            payloads = staging[n * tail :]
            for i, slot in enumerate(slots):
                if ok[i]:
                    ok[i] = self._adopt(pages, keys[i], slot, payloads, trailers, i)
        return ok

    def _adopt(
        self,
        pages: PageIO,
        key: str,
        slot: int,
        payloads: np.ndarray,
        trailers: np.ndarray,
        i: int,
    ) -> bool:
        """Check page ``key`` (the ``i``-th of the call, read for ``slot``) against its
        trailers and commit it; a page that fails is counted and removed."""
        parts, size = pages.parts, pages.object_bytes
        rows = range(i * parts, (i + 1) * parts)
        if pages.zero_copy:
            targets = pages.target(slot)
        else:
            targets = [payloads[r * size : (r + 1) * size] for r in rows]
        names = object_keys(key, parts)
        if not self._accepted(pages, names, slot, targets, [trailers[r].data for r in rows]):
            self._note("batch_remove", [int(c) for c in self._store.batch_remove(names, True)])
            return False
        pages.commit(slot, targets)
        return True

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

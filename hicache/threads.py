"""The wrong-thread guard: one thread drives a cache, an allocator or an engine.

None of them locks: the design has one scheduler thread drive the cache and its pools, and two
threads on one of them corrupt it silently (a page on the free list twice, a wedged engine). A
class that subclasses ``ThreadBound`` and names its mutating methods in ``thread_guarded`` (a
space-separated str) gets them checked: the first guarded call after construction binds the
calling thread as the owner, and a guarded call from any other thread raises
``WrongThreadError`` (a ``RuntimeError``) naming both threads, before any change. Queries
(``stats``, ``available_size``, ``check_invariants``, ...) are not guarded: a metrics thread may
read them.

Handing an object to another thread: building it binds nothing, so an embedding engine that
builds the cache on one thread and drives it from another needs no call, unless the builder
also drove it (a warm-up): then the driving thread calls ``bind_thread()`` on the cache, its
allocator and its request pool (``Engine.bind_thread`` does all four). An owner thread that has
ended is replaced by the next caller. The controller's own worker threads (transfers, storage
I/O, KV events) are the documented exception: they never call a guarded method, they work on
the tiers' queues and acks, which the driving thread polls.

A debug switch, off by default: ``HICACHE_CHECK_THREADS=1`` (``hicache.env``), read when the
guarded classes are defined; the test suite turns it on (``tests/conftest.py``). Off, nothing
is wrapped and a call costs nothing extra; on, about 0.16 us of CPU per guarded call on CPython
3.11 (``benchmarks/bench_thread_guard.py``), over the ~0.1 us the brief allowed for "always on".
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from hicache import env

__all__ = ["ThreadBound", "WrongThreadError"]

F = TypeVar("F", bound=Callable[..., Any])


class WrongThreadError(RuntimeError):
    """A guarded method called from a thread other than the object's owner."""


class ThreadBound:
    """Mixin: the methods named in ``thread_guarded`` (defined by this class or a subclass)
    run only on the owner thread, the first thread that called one of them."""

    thread_guarded: ClassVar[str] = ""  # method names, space-separated
    _owner_ident: int | None = None  # threading.get_ident() of the owner, None until bound
    _owner_thread: threading.Thread | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not env.threads_checked():
            return
        for name in cls.thread_guarded.split():
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, _guarded(method))
        if "__init__" in cls.__dict__:
            cls.__init__ = _unbound_after(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def unbind_thread(self) -> None:
        """Forget the owner: the next guarded call binds its thread."""
        vars(self).pop("_owner_ident", None)
        vars(self).pop("_owner_thread", None)

    def bind_thread(self) -> None:
        """Make the calling thread the owner (hand the object over to it)."""
        self._owner_thread = threading.current_thread()
        self._owner_ident = threading.get_ident()

    @property
    def owner_thread(self) -> threading.Thread | None:
        """The thread that drives this object, None until a guarded call."""
        return self._owner_thread

    def _claim_thread(self, method: str) -> None:
        """Bind the caller when unbound or the owner has ended, else raise."""
        owner = self._owner_thread
        if owner is None or not owner.is_alive():
            self.bind_thread()
            return
        me = threading.current_thread()
        kind = type(self).__name__
        raise WrongThreadError(
            f"{kind}.{method} called from thread {me.name!r} (ident {me.ident}), but this "
            f"{kind} is driven by thread {owner.name!r} (ident {owner.ident}): one thread "
            f"drives it; call bind_thread() from the new thread to hand it over"
        )


def _guarded(method: F) -> F:
    name, get_ident = method.__name__, threading.get_ident

    @functools.wraps(method)
    def guarded(self: ThreadBound, *args: Any, **kwargs: Any) -> Any:
        if self._owner_ident != get_ident():
            self._claim_thread(name)
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


def _unbound_after(init: F) -> F:
    """``init``, then forget the owner: building an object does not bind its thread."""

    @functools.wraps(init)
    def init_then_unbind(self: ThreadBound, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.unbind_thread()

    return init_then_unbind  # type: ignore[return-value]

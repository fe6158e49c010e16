"""A scripted stand-in for the storage tier: the cache's storage hooks, replaced on one cache
instance, record every call and answer as the test says."""

from __future__ import annotations

import dataclasses
from typing import Any

from hicache.radix.stats import StorageTierStats


def storage_stats(bytes_read: int) -> StorageTierStats:
    """A storage snapshot with ``bytes_read`` read and every other figure 0."""
    return StorageTierStats(
        backend="spy",
        queries=0,
        query_pages=0,
        hit_pages=0,
        prefetches=0,
        prefetch_revoked=0,
        prefetch_skipped_slower=0,
        prefetch_loaded_tokens=0,
        backup_pages=0,
        pending_prefetches=0,
        pending_backups=0,
        bytes_read=bytes_read,
        bytes_written=0,
        read_seconds=0.0,
        write_seconds=0.0,
        failures=0,
        breaker_state="closed",
    )


class StorageSpy:
    """Replaces the storage hooks of ``cache`` (instance attributes shadow the methods).

    ``start``: request ids (str) whose ``prefetch_from_storage`` returns True; such a prefetch
    is running until its id is put in ``done``; ``loaded[rid]`` is what
    ``pop_prefetch_loaded_tokens`` then answers. ``reading``: every ``stats()`` reports 4096
    more storage bytes read (a prefetch making progress). ``calls`` logs ``(hook, rid or
    args)`` in call order.
    """

    def __init__(self, cache: Any, start: set[str] | None = None) -> None:
        self.cache, self.start, self.done = cache, set(start or ()), set[str]()
        self.loaded: dict[str, int] = {}
        self.calls: list[tuple[str, Any]] = []
        self.prefetch_args: dict[str, tuple[Any, Any]] = {}
        self.reading, self._bytes = False, 0
        real_stats = cache.stats
        for hook in (
            "prefetch_from_storage",
            "check_prefetch_progress",
            "pop_prefetch_loaded_tokens",
            "release_aborted_request",
            "note_prefill",
        ):
            setattr(cache, hook, getattr(self, hook))

        def stats() -> Any:
            if self.reading:
                self._bytes += 4096
            return dataclasses.replace(real_stats(), storage=storage_stats(self._bytes))

        cache.stats = stats
        cache.has_storage_tier = lambda: True

    def hooks(self, name: str) -> list[Any]:
        return [arg for hook, arg in self.calls if hook == name]

    def prefetch_from_storage(
        self, req_id: str, last_host_node: Any, new_input_tokens: Any, last_hash: Any = None
    ) -> bool:
        self.calls.append(("prefetch_from_storage", req_id))
        self.prefetch_args[req_id] = (last_host_node, new_input_tokens)
        return req_id in self.start

    def check_prefetch_progress(self, req_id: str) -> bool:
        self.calls.append(("check_prefetch_progress", req_id))
        return req_id not in self.start or req_id in self.done

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        self.calls.append(("pop_prefetch_loaded_tokens", req_id))
        return self.loaded.pop(req_id, 0)

    def release_aborted_request(self, req_id: str) -> None:
        self.calls.append(("release_aborted_request", req_id))

    def note_prefill(self, tokens: int, seconds: float) -> None:
        self.calls.append(("note_prefill", (tokens, seconds)))

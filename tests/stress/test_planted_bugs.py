"""Bugs planted in the cache stack at test time: the stress checks must find each one.

Each bug fires once, on a chosen call of a patched library method, in the middle of a seeded
random scenario. Bugs in what an op changes (slots, locks, sizes, bytes it moved) must be found
by the incremental check in the op that planted them (the full check is pushed out of reach);
bytes corrupted where no op looks must be found by the full check at the next stride.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hicache.pools import HostKVPool, MHATokenToKVPoolHost, TokenToKVPoolAllocator
from hicache.pools.load_plan import LoadPlan
from hicache.radix import HiRadixCache
from hicache.stress import runner
from hicache.stress.config import StressConfig

NEVER = 10**9  # full_every: only the incremental check runs before the end of the scenario
BASE = StressConfig(ops=400, seed=3, full_every=NEVER)


class Plant:
    """Counts calls of the patched method; ``fire()`` is True on call ``at`` (once), noting the
    op number that was running then."""

    def __init__(self) -> None:
        self.at, self.calls, self.op = 0, 0, 0
        self.fired_op: int | None = None

    def fire(self, when: bool = True) -> bool:
        if self.fired_op is not None or not when:
            return False
        self.calls += 1
        if self.calls < self.at:
            return False
        self.fired_op = self.op
        return True


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Plant:
    p = Plant()
    step = runner.step

    def counted(driver: Any, name: str) -> None:
        p.op += 1
        step(driver, name)

    monkeypatch.setattr(runner, "step", counted)
    return p


def _patch(
    monkeypatch: pytest.MonkeyPatch,
    cls: type,
    name: str,
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    monkeypatch.setattr(cls, name, make(getattr(cls, name)))


def _caught_in_op(plant: Plant, cfg: StressConfig, words: tuple[str, ...]) -> str:
    report = runner.run(cfg)
    assert plant.fired_op is not None, "the planted bug never fired"
    assert report.violations, "the planted bug went unnoticed"
    header, text = report.violations[0], "\n".join(report.violations)
    assert header.startswith(f"op {plant.fired_op} ("), (plant.fired_op, text)
    assert any(w in text for w in words), text
    return text


def _in_use(allocator: TokenToKVPoolAllocator) -> torch.Tensor:
    """Every allocated slot, ascending."""
    every = torch.arange(*allocator.slot_range)
    return every[~torch.isin(every, allocator.free_slots())]


# ---- slots -----------------------------------------------------------------------------------


def test_a_slot_leaked_by_a_free_is_caught_in_that_op(plant, monkeypatch):
    """``free`` silently keeps the last page of a multi-page free (eviction, finish, abort)."""
    plant.at = 40

    def make(free):
        def leaky(self, indices):
            if plant.fire(indices.numel() > 1):
                indices = indices[:-1]
            return free(self, indices)

        return leaky

    _patch(monkeypatch, TokenToKVPoolAllocator, "free", make)
    _caught_in_op(plant, BASE, ("leaked",))


def test_a_host_slot_leaked_by_host_eviction_is_caught_in_that_op(plant, monkeypatch):
    plant.at = 20

    def make(free):
        def leaky(self, indices):
            if plant.fire(indices.numel() > 1):
                indices = indices[:-1]
            return free(self, indices)

        return leaky

    _patch(monkeypatch, HostKVPool, "free", make)
    _caught_in_op(plant, BASE, ("host: slots leaked", "host: "))


def test_a_slot_handed_out_twice_is_caught_in_that_op(plant, monkeypatch):
    """``alloc`` swaps one slot of its answer for a slot already in use (a node's or a
    request's): two owners, one slot."""
    plant.at = 30

    def make(alloc):
        def double(self, n):
            slots = alloc(self, n)
            if slots is not None and plant.fire(slots.numel() > 0):
                used = _in_use(self)
                used = used[~torch.isin(used, slots.cpu())]
                if used.numel():
                    slots = slots.clone()
                    slots[-self.page_size :] = used[: self.page_size].to(slots.device)
                    return slots
                plant.fired_op = None
            return slots

        return double

    _patch(monkeypatch, TokenToKVPoolAllocator, "alloc", make)
    _caught_in_op(plant, BASE, ("owned twice",))


def test_a_free_of_the_wrong_pages_is_caught_though_the_counts_balance(plant, monkeypatch):
    """``free`` releases other allocated pages of the same size instead of the ones asked
    for: free + owned still adds up, only the free list shows it."""
    plant.at = 40

    def make(free):
        def wrong(self, indices):
            if plant.fire(indices.numel() > 0):
                others = _in_use(self)
                others = others[~torch.isin(others, indices.cpu())]
                if others.numel() >= indices.numel():
                    indices = others[: indices.numel()]
                else:
                    plant.fired_op = None
            return free(self, indices)

        return wrong

    _patch(monkeypatch, TokenToKVPoolAllocator, "free", make)
    text = _caught_in_op(plant, BASE.with_(page_size=1), ("leaked", "owned and free"))
    assert "!=" not in text.split("\n")[1], "the counts balance: the free list must catch it"


def test_a_wrong_size_counter_is_caught_in_that_op(plant, monkeypatch):
    plant.at = 25
    _patch(
        monkeypatch,
        HiRadixCache,
        "evict",
        lambda evict: lambda self, n: evict(self, n) + (1 if plant.fire() else 0),
    )
    fired = {"yes": False}

    def make(size):
        def lying(self):
            fired["yes"] = fired["yes"] or plant.fired_op is not None
            return size(self) + (1 if fired["yes"] else 0)

        return lying

    _patch(monkeypatch, HiRadixCache, "evictable_size", make)
    _caught_in_op(plant, BASE, ("the tree counts",))


# ---- locks -----------------------------------------------------------------------------------


def test_a_lock_leaked_by_finishing_a_request_is_caught_in_that_op(plant, monkeypatch):
    plant.at = 10

    def make(finished):
        def leaky(self, req):
            node = req.last_node  # the request's lock is released on it
            finished(self, req)
            if plant.fire(node is not self.root and node.value is not None):
                self.inc_lock_ref(node)

        return leaky

    _patch(monkeypatch, HiRadixCache, "cache_finished_req", make)
    _caught_in_op(plant, BASE, ("lock leaked",))


def test_a_dropped_unlock_is_caught_in_that_op(plant, monkeypatch):
    """``dec_lock_ref`` does nothing once (the driver's, a request's or a transfer ack's)."""
    plant.at = 30
    _patch(
        monkeypatch,
        HiRadixCache,
        "dec_lock_ref",
        lambda dec: lambda self, node: 0 if plant.fire() else dec(self, node),
    )
    _caught_in_op(plant, BASE, ("lock leaked",))


# ---- bytes -----------------------------------------------------------------------------------


def _corrupt_device(pool: Any, slot: torch.Tensor) -> None:
    """Overwrite one device slot's K and V in layer 0 with a value the oracle never writes."""
    junk = torch.full((1, pool.head_num, pool.head_dim), 127.0, dtype=pool.dtype)
    pool.set_kv_buffer(0, slot.reshape(1).to(pool.device), junk, junk)


def test_a_corrupted_load_is_caught_in_that_op(plant, monkeypatch):
    plant.at = 5

    def make(run):
        def corrupting(self, layer_id):
            run(self, layer_id)
            if plant.fire(layer_id == self.num_layers - 1):
                _corrupt_device(self.device_pool, self.device_indices[-1])

        return corrupting

    _patch(monkeypatch, LoadPlan, "run", make)
    _caught_in_op(plant, BASE, ("differ",))


def test_a_corrupted_backup_is_caught_in_the_op_that_wrote_it(plant, monkeypatch):
    """The host copy is wrong after the write lands: checked in that op, not at a sweep."""
    plant.at = 5

    def make(backup):
        def corrupting(self, device_pool, host_idx, dev_idx, io):
            backup(self, device_pool, host_idx, dev_idx, io)
            if plant.fire():
                self.host_parts[0][0, host_idx[-1]] = 127.0  # layer_first: [L, slots, H, D]

        return corrupting

    _patch(monkeypatch, MHATokenToKVPoolHost, "backup_from_device_all_layer", make)
    _caught_in_op(plant, BASE, ("host copy", "differ"))


@pytest.mark.parametrize("full_every", [10, 50])
def test_bytes_corrupted_where_no_op_looks_are_caught_by_the_next_full_check(
    plant, monkeypatch, full_every
):
    """An eviction also scribbles over an untouched cached slot (of a locked node, so it is
    still cached when the next full check comes): no header changes, so the incremental check
    cannot see it; a request reading it or the next full check must."""
    plant.at = 20
    cfg = BASE.with_(full_every=full_every)

    def make(evict):
        def scribbling(self, n):
            freed = evict(self, n)
            slots = [node.value for node in _device_nodes(self) if node.lock_ref]
            if slots and plant.fire():
                _corrupt_device(self.token_to_kv_pool_allocator.get_kvcache(), slots[0][0])
            return freed

        return scribbling

    _patch(monkeypatch, HiRadixCache, "evict", make)
    report = runner.run(cfg)
    assert plant.fired_op is not None and report.violations
    header = report.violations[0]
    found = int(header.split()[4 if header.startswith("full") else 1].rstrip(","))
    assert plant.fired_op <= found <= -(-plant.fired_op // full_every) * full_every, header
    assert "differ" in "\n".join(report.violations)


def _device_nodes(cache: HiRadixCache) -> list[Any]:
    stack, out = list(cache.root.children.values()), []
    while stack:
        node = stack.pop()
        if node.value is not None:
            out.append(node)
        stack.extend(node.children.values())
    return out


def test_the_clean_scenario_these_bugs_are_planted_in_is_clean():
    report = runner.run(BASE)
    assert not report.violations, report.violations[:5]
    assert report.counts["load_back"] and report.counts["evicted"]

"""Fault injection below the tree: pools + HiCacheController under flaky allocators, transfers that
fail part-way and resets with work queued.

A small owner (standing in for the radix cache) keeps groups of slots, each holding the KV of a
run of tokens, and drives the controller at random. After every step the allocators' free lists
must be exactly the complement of what the owner holds, the controller's queues must match what
the owner queued, and every copy the owner considers valid must hold the right bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from hicache.pools import ROUTES
from hicache.stress.faults import Faults, InjectedFault
from hicache.stress.oracle import device_kv, host_kv, mismatches, write_kv
from tests.controller.helpers import make_rig


@dataclass(eq=False)
class Group:
    tokens: torch.Tensor
    positions: torch.Tensor
    dev: torch.Tensor | None = None
    host: torch.Tensor | None = None
    writing: bool = False  # host copy queued or issued, not yet landed
    loading: bool = False  # device copy queued or issued, not yet landed

    @property
    def busy(self) -> bool:
        return self.writing or self.loading


class Owner:
    """Holds slot groups and drives one controller; every step checks the accounting."""

    def __init__(self, rig, faults: Faults, rng: random.Random) -> None:
        self.rig, self.faults, self.rng = rig, faults, rng
        self.ctrl = rig.controller
        self.groups: list[Group] = []
        self.page = rig.allocator.page_size
        self.all_device = rig.allocator.free_slots().tolist()
        self.all_host = rig.host_pool.free_slots().tolist()

    def pick(self, want) -> Group | None:
        cands = [g for g in self.groups if want(g)]
        return self.rng.choice(cands) if cands else None

    def create(self) -> None:
        n = self.page * self.rng.randint(1, 2)
        dev = self.rig.allocator.alloc(n)
        if dev is not None:
            tokens = torch.randint(
                0, 1000, (n,), generator=torch.Generator().manual_seed(self.rng.randrange(2**31))
            )
            group = Group(tokens, torch.arange(n), dev=dev)
            write_kv(self.rig.device_pool, dev, group.tokens, group.positions)
            self.groups.append(group)

    def backup(self) -> None:
        g = self.pick(lambda g: g.dev is not None and g.host is None and not g.busy)
        if g is not None:
            g.host = self.ctrl.write(g.dev, node_id=id(g))
            g.writing = g.host is not None

    def load(self) -> None:
        g = self.pick(lambda g: g.dev is None and not g.busy)
        if g is not None:
            g.dev = self.ctrl.load(g.host, node_id=id(g))
            g.loading = g.dev is not None

    def flush(self, writes: bool) -> None:
        ctrl, flag = self.ctrl, "writing" if writes else "loading"
        queue, acks = (
            (ctrl.write_queue, ctrl.ack_write_queue)
            if writes
            else (ctrl.load_queue, ctrl.ack_load_queue)
        )
        before = (list(queue), len(acks))
        try:
            ctrl.start_writing() if writes else ctrl.start_loading()
        except InjectedFault:
            assert (queue, len(acks)) == before, "a failed batch changed the queue"
            return
        acks.clear()  # CPU: every issued batch has landed
        for g in self.groups:
            setattr(g, flag, False)
        self.verify_bytes()

    def drop(self, tier: str) -> None:
        other = "host" if tier == "dev" else "dev"
        g = self.pick(lambda g: g.dev is not None and g.host is not None and not g.busy)
        if g is not None:
            evict = self.ctrl.evict_device if tier == "dev" else self.ctrl.evict_host
            evict(getattr(g, tier))
            setattr(g, tier, None)
            assert getattr(g, other) is not None

    def delete(self) -> None:
        g = self.pick(lambda g: not g.busy)
        if g is not None:
            self._release(g, dev=True, host=True)
            self.groups.remove(g)

    def reset(self) -> None:
        """Controller reset; the owner then takes back what its queued or issued ops held."""
        self.ctrl.reset()
        for g in self.groups:
            self._release(g, dev=g.loading, host=g.writing)
            g.writing = g.loading = False
        self.groups = [g for g in self.groups if g.dev is not None or g.host is not None]

    def _release(self, g: Group, dev: bool, host: bool) -> None:
        if dev and g.dev is not None:
            self.ctrl.evict_device(g.dev)
            g.dev = None
        if host and g.host is not None:
            self.ctrl.evict_host(g.host)
            g.host = None

    def check(self) -> None:
        rig = self.rig
        rig.allocator.check_invariants()
        rig.host_pool.check_invariants()
        for name, held, all_slots, pool in (
            ("device", [g.dev for g in self.groups], self.all_device, rig.allocator),
            ("host", [g.host for g in self.groups], self.all_host, rig.host_pool),
        ):
            owned = sorted(int(s) for t in held if t is not None for s in t.tolist())
            assert len(owned) == len(set(owned)), f"a {name} slot is held twice"
            free = sorted(set(all_slots) - set(owned))
            assert pool.free_slots().tolist() == free, f"{name} slots leaked or freed twice"
        assert len(self.ctrl.write_queue) == sum(g.writing for g in self.groups)
        assert len(self.ctrl.load_queue) == sum(g.loading for g in self.groups)

    def verify_bytes(self) -> None:
        dev, host = self.rig.device_pool, self.rig.host_pool
        for g in self.groups:
            if g.dev is not None and not g.loading:
                read = lambda layer, part, s: device_kv(dev, layer, part, s)  # noqa: E731
                assert not mismatches(dev, read, g.dev, g.tokens, g.positions)
            if g.host is not None and not g.writing:
                read = lambda layer, part, s: host_kv(host, layer, part, s)  # noqa: E731
                assert not mismatches(dev, read, g.host, g.tokens, g.positions)


STEPS = {
    "create": (4, Owner.create),
    "backup": (3, Owner.backup),
    "load": (3, Owner.load),
    "start_writing": (2, lambda o: o.flush(writes=True)),
    "start_loading": (2, lambda o: o.flush(writes=False)),
    "drop_device": (2, lambda o: o.drop("dev")),
    "drop_host": (1, lambda o: o.drop("host")),
    "delete": (2, Owner.delete),
    "reset": (0.3, Owner.reset),
}


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_controller_survives_random_faults(kind, io_backend, layout, page_size):
    rng = random.Random(f"{kind}{io_backend}{layout}{page_size}")
    rig = make_rig(kind, io_backend, layout, page_size=page_size, pages=6, ratio=2.0)
    faults = Faults(rng, p_alloc_none=0.2, p_transfer_fail=0.25)
    for pool, name in ((rig.allocator, "device_none"), (rig.host_pool, "host_none")):
        faults.flaky_alloc(pool, name)
    faults.failing_load(rig.host_pool)
    faults.failing_backup(rig.host_pool)
    owner = Owner(rig, faults, rng)
    names, weights = list(STEPS), [w for w, _ in STEPS.values()]
    for step in range(600):
        STEPS[rng.choices(names, weights)[0]][1](owner)
        owner.check()
        if step % 25 == 0:
            owner.verify_bytes()
    faults.enabled = False
    owner.flush(writes=True)
    owner.flush(writes=False)
    owner.verify_bytes()
    assert {"device_none", "host_none", "load_fail", "backup_fail"} <= set(faults.injected)
    faults.restore()
    assert "alloc" not in vars(rig.allocator)


def test_failed_load_keeps_the_queue_and_a_retry_lands_every_layer():
    rig = make_rig(pages=4)
    faults = Faults(random.Random(0), p_transfer_fail=1.0)
    faults.failing_load(rig.host_pool)
    dev = rig.allocator.alloc(2)
    write_kv(rig.device_pool, dev, torch.tensor([5, 6]), torch.arange(2))
    host = rig.controller.write(dev, node_id=1)
    rig.controller.start_writing()
    rig.controller.evict_device(dev)
    loaded = rig.controller.load(host, node_id=2)
    with pytest.raises(InjectedFault, match="layer 1"):
        rig.controller.start_loading()
    assert len(rig.controller.load_queue) == 1 and rig.controller.ack_load_queue == []
    faults.enabled = False
    assert rig.controller.start_loading() >= 0
    read = lambda layer, part, s: device_kv(rig.device_pool, layer, part, s)  # noqa: E731
    assert not mismatches(rig.device_pool, read, loaded, torch.tensor([5, 6]), torch.arange(2))

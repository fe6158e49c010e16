"""Direct- and auto-backend writes never wait for the device: a write whose device indices are
still on their way to the CPU stays queued (with the writes after it) and is issued by the first
``start_writing`` that finds the copy landed; ``drain`` waits for it.

On CPU the indices are already on the CPU, so the copy ``fetch_indices`` starts on CUDA is
stood in for by an operation carrying its CPU copy and a ``cpu_ready`` event that completes when
the test says so. ``test_controller_gpu.py`` checks on CUDA that no step synchronizes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hicache.controller.operations import CacheOperation
from tests.controller.helpers import assert_same_bytes, fill_random, make_rig, read_bytes

BACKENDS = pytest.mark.parametrize("io_backend", ["direct", "auto"])


class Pending:
    """An event that completes when ``done`` is set; ``synchronize`` completes it."""

    def __init__(self) -> None:
        self.done = False
        self.waited = False

    def record(self, stream: object = None) -> None: ...

    def wait(self, stream: object = None) -> None: ...

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def host_bytes(rig, host_indices: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the host copy's bytes at ``host_indices`` laid out as ``read_bytes`` (K|V)."""
    parts = rig.host_pool.host_parts  # layer_first: [layers, slots, heads, dim] each
    return [
        torch.cat([p[layer, host_indices].contiguous().view(torch.uint8) for p in parts], -1)
        for layer in range(rig.device_pool.layer_num)
    ]


def queued_rig(io_backend: str):
    """Two queued writes, the first still fetching its indices: (rig, pending, ops)."""
    rig = make_rig("mha", io_backend, "layer_first", page_size=1, pages=8)
    ctrl = rig.controller
    slots = [rig.allocator.alloc(2), rig.allocator.alloc(2)]
    for j, s in enumerate(slots):
        fill_random(rig.device_pool, s, seed=j)
    host = [ctrl.write(s, node_id=j + 1) for j, s in enumerate(slots)]
    pending = Pending()
    first = ctrl.write_queue[0]
    ctrl.write_queue[0] = replace(
        first, device_indices_cpu=first.device_indices.clone(), cpu_ready=pending
    )
    return rig, pending, slots, host


@BACKENDS
def test_a_write_waits_in_the_queue_until_its_indices_landed(io_backend):
    rig, pending, slots, host = queued_rig(io_backend)
    ctrl = rig.controller
    before = [host_bytes(rig, h) for h in host]
    ctrl.start_writing()
    # the first write is not readable yet, so neither it nor the one after it is issued
    assert [op.node_ids for op in ctrl.write_queue] == [[1], [2]]
    assert ctrl.ack_write_queue == [] and not pending.waited
    assert all(
        torch.equal(a, b) for h, want in zip(host, before, strict=True)
        for a, b in zip(host_bytes(rig, h), want, strict=True)
    )  # fmt: skip
    assert ctrl.stats().write_queue_tokens == 4
    pending.done = True
    ctrl.start_writing()
    assert ctrl.write_queue == [] and [a.node_ids for a in ctrl.ack_write_queue] == [[1, 2]]
    for s, h in zip(slots, host, strict=True):
        assert_same_bytes(host_bytes(rig, h), read_bytes(rig.device_pool, s))


@BACKENDS
def test_drain_waits_for_the_indices_then_issues_and_lands_the_writes(io_backend):
    rig, pending, slots, host = queued_rig(io_backend)
    ctrl = rig.controller
    ctrl.drain()
    assert pending.waited
    assert ctrl.write_queue == [] and [a.node_ids for a in ctrl.ack_write_queue] == [[1, 2]]
    for s, h in zip(slots, host, strict=True):
        assert_same_bytes(host_bytes(rig, h), read_bytes(rig.device_pool, s))


@BACKENDS
def test_merged_writes_carry_the_cpu_copies(io_backend):
    rig, pending, _, _ = queued_rig(io_backend)
    pending.done = True
    ops = [replace(op, cpu_ready=None) for op in rig.controller.write_queue]
    ops[1] = replace(ops[1], device_indices_cpu=ops[1].device_indices.clone())
    merged = CacheOperation.merge(ops)
    assert torch.equal(merged.device_indices_cpu, merged.device_indices)
    assert merged.cpu_ready is None

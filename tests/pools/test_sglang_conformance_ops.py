"""Conformance of the operations SGLang's ``KVCache`` subclasses all have, over every device KV
pool: getters wait on the registered ``LayerDoneCounter``; ``move_kv_cache``,
``get_cpu_copy``/``load_cpu_copy``, ``get_contiguous_buf_infos``, ``get_state_buf_infos``,
``get_kv_size_bytes`` and ``mem_usage`` on random data; misuse changes no byte."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hicache.pools import HybridLinearKVPool, NSATokenToKVPool, SWAKVPool
from tests.pools.helpers import DEVICES
from tests.pools.mamba_helpers import RecordingCounter
from tests.pools.sglang_pools import (
    FACTORIES,
    all_buffers,
    gather,
    inner,
    kv_layers,
    randomize,
    slots,
)

NAMES = list(FACTORIES)


def extra_getters(pool: Any, layer: int) -> list[Any]:
    """The pool's getters beyond K / V / KV, as calls of ``layer``."""
    if hasattr(pool, "get_label_buffer"):
        return [lambda: pool.get_label_buffer(layer)]
    if isinstance(pool, NSATokenToKVPool):
        pages = torch.arange(1, device=pool.device)
        return [
            lambda: pool.get_index_k_with_scale_buffer(layer),
            lambda: pool.get_index_k_continuous(layer, 5, pages),
            lambda: pool.get_index_k_scale_continuous(layer, 5, pages),
            lambda: pool.get_index_k_scale_buffer(layer, 5, pages),
        ]
    return []


@pytest.mark.parametrize("name", NAMES)
def test_every_getter_waits_for_its_layer(name: str) -> None:
    pool = FACTORIES[name]("cpu")
    counter = RecordingCounter()
    pool.register_layer_transfer_counter(counter)
    for layer in kv_layers(pool):
        getters = [pool.get_key_buffer, pool.get_value_buffer, pool.get_kv_buffer]
        calls = [lambda g=g, layer=layer: g(layer) for g in getters]
        calls += extra_getters(pool, layer)
        for call in calls:
            counter.waited.clear()
            call()
            assert counter.waited == [layer - getattr(pool, "start_layer", 0)], name
    pool.register_layer_transfer_counter(None)  # SGLang clears a counter with None
    counter.waited.clear()
    pool.get_kv_buffer(kv_layers(pool)[0])
    assert counter.waited == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_move_kv_cache_matches_reference(name: str, device: str) -> None:
    pool = FACTORIES[name](device)
    loc = slots(pool, 8)
    src, tgt, rest = loc[:3], loc[3:6], loc[6:]
    randomize(pool, seed=1)
    want, keep = gather(pool, src), gather(pool, rest)
    pool.move_kv_cache(tgt, src)
    for got, ref in zip(gather(pool, tgt), want, strict=True):
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)), name
    for got, ref in zip(gather(pool, rest), keep, strict=True):
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_cpu_copy_round_trip(name: str, device: str) -> None:
    pool = FACTORIES[name](device)
    loc = slots(pool, 5)
    randomize(pool, seed=2)
    want = gather(pool, loc)
    for p in inner(pool):
        p.cpu_offloading_chunk_size = 2  # SGLang's attribute: chunks of 2, 2, 1 tokens
    copy = pool.get_cpu_copy(loc)
    full_copy = copy["full"] if isinstance(copy, dict) and "full" in copy else copy
    full_copy = full_copy["kv"] if isinstance(full_copy, dict) else full_copy
    assert [len(c) for c in full_copy] == [3] * inner(pool)[0].layer_num
    flat = _tensors(copy)
    assert flat and all(t.device.type == "cpu" for t in flat)
    randomize(pool, seed=3)  # every byte differs from the copy somewhere
    pool.load_cpu_copy(copy, loc)
    for got, ref in zip(gather(pool, loc), want, strict=True):
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)), name


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _infos(bufs: list[torch.Tensor], page: int) -> tuple[list[int], list[int], list[int]]:
    """SGLang's triple for per-layer KV buffers: pointer, bytes, bytes of one page."""
    return (
        [b.data_ptr() for b in bufs],
        [b.nbytes for b in bufs],
        [b[0].nbytes * page for b in bufs],
    )


def _kv_buffers(pool: Any) -> list[torch.Tensor]:
    """SGLang's order: every layer's K, then every layer's V (MLA: the latents)."""
    return [b for part in pool.part_buffers for b in part]


@pytest.mark.parametrize("name", NAMES)
def test_buf_infos_sizes_and_mem_usage(name: str) -> None:
    pool = FACTORIES[name]("cpu")
    infos, state = pool.get_contiguous_buf_infos(), pool.get_state_buf_infos()
    for triple in (infos, state):
        assert isinstance(triple, tuple) and len(triple) == 3
        assert all(isinstance(v, int) for lst in triple for v in lst)
        assert len({len(lst) for lst in triple}) == 1
    full = inner(pool)[0]
    want = _infos(_kv_buffers(full), full.page_size)
    n = len(want[0])  # FP4 / DoubleSparse pools list their scales or labels after the KV
    assert tuple(lst[:n] for lst in infos) == want, name
    if isinstance(pool, SWAKVPool):
        assert state == pool.swa_kv_pool.get_contiguous_buf_infos()
    if isinstance(pool, HybridLinearKVPool):
        assert state == pool.mamba_pool.get_contiguous_buf_infos()
    size = pool.get_kv_size_bytes()
    total = sum(size) if isinstance(size, tuple) else size
    assert total == sum(b.nbytes for b in all_buffers(pool) if not _is_mamba(pool, b))
    assert isinstance(pool.mem_usage, float) and pool.mem_usage == pytest.approx(total / 2**30)
    if hasattr(full, "v_buffer") and not isinstance(pool, HybridLinearKVPool | SWAKVPool):
        assert isinstance(size, tuple) and size[1] >= sum(b.nbytes for b in full.v_buffer)


def _is_mamba(pool: Any, buf: torch.Tensor) -> bool:
    mamba = getattr(pool, "mamba_pool", None)
    return mamba is not None and any(buf is t for t in mamba.mamba_cache.tensors())


def _misuse(pool: Any, loc: torch.Tensor) -> list[tuple[str, Any]]:
    """(argument the error names, call) for bad calls of the shared operations."""
    bad_loc = torch.tensor([10**6], device=loc.device)
    copy = pool.get_cpu_copy(loc)
    layer = kv_layers(pool)[0]
    return [
        ("tgt_loc", lambda: pool.move_kv_cache(loc[:2].float(), loc[:2])),
        ("tgt_loc", lambda: pool.move_kv_cache(loc[:2], loc[:3])),
        ("loc", lambda: pool.move_kv_cache(bad_loc, loc[:1])),
        ("indices", lambda: pool.get_cpu_copy(loc.float())),
        ("kv_cache_cpu", lambda: pool.load_cpu_copy(copy, loc[:2])),
        ("kv_cache_cpu", lambda: pool.load_cpu_copy([], loc)),
        ("layer_id", lambda: pool.get_key_buffer(max(kv_layers(pool)) + 7)),
        ("cache", lambda: pool.set_kv_buffer(layer, loc[:2], *_bad_caches(pool))),
    ]


def _bad_caches(pool: Any) -> list[torch.Tensor]:
    """Caches of the wrong shape (one row too many) for ``set_kv_buffer`` (errors name
    ``cache_k``, ``cache_kv`` or ``cache_label``)."""
    full = inner(pool)[0]
    n = 2 if isinstance(full, NSATokenToKVPool) or not hasattr(full, "v_buffer") else 3
    extra = 1 if hasattr(full, "label_buffer") else 0
    rand = torch.rand(3, 2, 8, dtype=full.dtype, device=full.device)
    return [rand] * (n - 1 + extra)


@pytest.mark.parametrize("name", NAMES)
def test_misuse_changes_no_byte(name: str) -> None:
    pool = FACTORIES[name]("cpu")
    loc = slots(pool, 4)
    randomize(pool, seed=4)
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    before = [b.clone() for b in all_buffers(pool)]
    mapped = None if mapping is None else mapping.clone()
    for what, call in _misuse(pool, loc):
        with pytest.raises((TypeError, ValueError, IndexError)) as err:
            call()
        assert what in str(err.value), (name, what, err.value)
        for got, ref in zip(all_buffers(pool), before, strict=True):
            assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)), (name, what)
        assert mapped is None or torch.equal(pool.full_to_swa_index_mapping, mapped)

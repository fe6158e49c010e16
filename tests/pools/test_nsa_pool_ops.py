"""NSATokenToKVPool's whole-pool operations: move_kv_cache, the CPU copies, sizes, and the
pipeline's global layer ids, all covering the index keys and scales token by token."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import NSATokenToKVPool
from tests.pools.helpers import DEVICES, POISON, as_bytes, fill_random, poison
from tests.pools.nsa_helpers import (
    HEAD,
    PAGE,
    ROW,
    FakeCounter,
    index_inputs,
    nsa_pool,
    slot_ranges,
)


@pytest.mark.parametrize("device", DEVICES)
def test_move_kv_cache_moves_index_tokens(device: str) -> None:
    pool = nsa_pool(device)
    fill_random([*pool.kv_buffer, *pool.index_k_with_scale_buffer], seed=5)
    before = [b.cpu().flatten().clone() for b in pool.index_k_with_scale_buffer]
    latent = [b.clone() for b in pool.kv_buffer]
    tgt, src = [70, 64, 190, 129], [64, 150, 70, 100]  # overlapping: 64 and 70 both ways
    pool.move_kv_cache(torch.tensor(tgt, device=device), torch.tensor(src, device=device))
    for buf, old in zip(pool.index_k_with_scale_buffer, before, strict=True):
        want = old.clone()
        for t, s in zip(tgt, src, strict=True):
            for t_range, s_range in zip(slot_ranges(t), slot_ranges(s), strict=True):
                want[t_range] = old[s_range]
        assert torch.equal(buf.cpu().flatten(), want)
    for buf, old in zip(pool.kv_buffer, latent, strict=True):
        assert torch.equal(as_bytes(buf[tgt]), as_bytes(old[src]))


@pytest.mark.parametrize("device", DEVICES)
def test_cpu_copy_round_trip(device: str) -> None:
    pool = nsa_pool(device)
    fill_random([*pool.kv_buffer, *pool.index_k_with_scale_buffer], seed=6)
    indices = torch.tensor([64, 65, 130, 191], device=device)
    want = [b.cpu().flatten().clone() for b in pool.index_k_with_scale_buffer]
    want_latent = [b[indices].cpu() for b in pool.kv_buffer]
    copy = pool.get_cpu_copy(indices)
    assert set(copy) == {"kv", "index_k"} and copy["index_k"][0][0].shape == (4, HEAD)
    for buf in [*pool.kv_buffer, *pool.index_k_with_scale_buffer]:
        poison(buf)
    pool.load_cpu_copy(copy, indices)
    for buf, old in zip(pool.index_k_with_scale_buffer, want, strict=True):
        expected = torch.full_like(old, POISON)
        for slot in indices.tolist():
            for rng in slot_ranges(slot):
                expected[rng] = old[rng]
        assert torch.equal(buf.cpu().flatten(), expected)  # those tokens, nothing else
    for buf, old in zip(pool.kv_buffer, want_latent, strict=True):
        assert torch.equal(as_bytes(buf[indices].cpu()), as_bytes(old))


def test_load_cpu_copy_misuse_writes_nothing() -> None:
    pool = nsa_pool()
    indices = torch.tensor([64, 65])
    good = pool.get_cpu_copy(indices)
    fill_random([*pool.kv_buffer, *pool.index_k_with_scale_buffer], seed=7)
    before = [b.clone() for b in [*pool.kv_buffer, *pool.index_k_with_scale_buffer]]
    short = [(k[:1], s[:1]) for k, s in good["index_k"]]
    for bad in ({"kv": good["kv"]}, {**good, "index_k": short}, {**good, "kv": []}):
        with pytest.raises(ValueError, match="kv_cache_cpu"):
            pool.load_cpu_copy(bad, indices)
    after = [*pool.kv_buffer, *pool.index_k_with_scale_buffer]
    assert all(torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(before, after, strict=True))


def test_sizes_and_pipeline_layers() -> None:
    pool = NSATokenToKVPool(
        128, PAGE, 16, torch.bfloat16, 8, 2, "cpu", 128, start_layer=3, end_layer=4
    )
    latent = 2 * 192 * 24 * 2  # layers * slots * kv_dim * bf16
    assert pool.get_kv_size_bytes() == latent + 2 * 3 * ROW
    counter = FakeCounter()
    pool.register_layer_transfer_counter(counter)
    keys, scales = index_inputs(1, "cpu")
    pool.set_index_k_scale_buffer(4, torch.tensor([64]), keys, scales)  # global id 4: local 1
    assert torch.equal(pool.index_k_with_scale_buffer[1][1, :HEAD], keys[0].view(torch.uint8))
    pool.get_index_k_with_scale_buffer(3)
    assert counter.waits == [0]  # the counter numbers layers locally
    with pytest.raises(ValueError, match="layer_id"):
        pool.get_index_k_continuous(2, 1, torch.tensor([1]))

"""The tiny transformer: config checks, determinism, and pool-backed incremental decoding."""

from __future__ import annotations

import pytest
import torch

from hicache.model import ForwardBatch, ModelConfig, TinyTransformer, make_kv_pool, reference_logits
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator

CONFIGS = [ModelConfig(attention="mha"), ModelConfig(attention="mla", num_kv_heads=1)]


class RecordingCounter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


class Harness:
    """One model with its pools; runs extend steps for several requests."""

    def __init__(self, cfg: ModelConfig, size: int = 256) -> None:
        self.model = TinyTransformer(cfg)
        self.pool = make_kv_pool(cfg, size, 1, "cpu")
        self.alloc = TokenToKVPoolAllocator(size, 1, "cpu", kvcache=self.pool)
        self.req_pool = ReqToTokenPool(8, size, "cpu")

    def step(self, rows: list[int], prefix: list[int], ids: list[list[int]]) -> torch.Tensor:
        slots = self.alloc.alloc(sum(len(x) for x in ids))
        assert slots is not None
        start = 0
        for row, p, x in zip(rows, prefix, ids, strict=True):
            self.req_pool.write((row, slice(p, p + len(x))), slots[start : start + len(x)].int())
            start += len(x)
        batch = ForwardBatch.build(self.req_pool.req_to_token, rows, prefix, ids, slots, "cpu")
        return self.model(batch, self.pool)


@pytest.mark.parametrize(
    "bad",
    [
        {"num_layers": 0},
        {"attention": "gqa"},
        {"num_heads": 3},
        {"head_dim": 7},
        {"dtype": torch.int32},
    ],
)
def test_config_rejects_bad_values(bad: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        ModelConfig(**bad)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "mla"])
def test_weights_are_seeded(cfg: ModelConfig) -> None:
    ids = list(range(3, 20))
    same = reference_logits(TinyTransformer(cfg), ids)
    assert torch.equal(same, reference_logits(TinyTransformer(cfg), ids))
    other = reference_logits(TinyTransformer(ModelConfig(attention=cfg.attention, seed=1)), ids)
    assert not torch.allclose(same, other)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "mla"])
def test_batched_extend_and_decode_match_reference(cfg: ModelConfig) -> None:
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (23, 9, 31)]
    h = Harness(cfg)
    h.alloc.alloc(7)  # offset the slots so requests do not sit at 1..n
    cut = [11, 4, 30]
    first = h.step([0, 1, 2], [0, 0, 0], [s[:c] for s, c in zip(seqs, cut, strict=True)])
    second = h.step([0, 1, 2], cut, [s[c:] for s, c in zip(seqs, cut, strict=True)])
    for i, s in enumerate(seqs):
        ref = reference_logits(h.model, s)
        torch.testing.assert_close(first[i], ref[cut[i] - 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(second[i], ref[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "mla"])
def test_attention_reads_each_layer_through_the_pool(cfg: ModelConfig) -> None:
    h = Harness(cfg)
    counter = RecordingCounter()
    h.pool.register_layer_transfer_counter(counter)
    h.step([0], [0], [[1, 2, 3]])
    assert sorted(set(counter.waits)) == list(range(cfg.num_layers))
    assert counter.waits == sorted(counter.waits)


def test_forward_batch_rejects_empty_requests() -> None:
    table = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError):
        ForwardBatch.build(table, [0], [0], [[]], torch.zeros(0, dtype=torch.int64), "cpu")
    with pytest.raises(ValueError):
        ForwardBatch.build(table, [0, 1], [0], [[1]], torch.ones(1, dtype=torch.int64), "cpu")

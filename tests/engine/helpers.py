"""Multi-turn chat driver and the from-scratch comparison shared by the engine tests."""

from __future__ import annotations

import random
from typing import Any

import torch

from hicache.engine import Engine, Request, Status
from hicache.model import reference_logits

# The smallest `hicache bench` settings (BenchConfig.from_args keywords) that still evict.
TINY = {
    "users": 3,
    "rounds": 3,
    "system_len": 24,
    "prompt_len": 16,
    "answer_len": 3,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "intermediate": 32,
    "vocab": 64,
    "device_tokens": 96,
    "max_running": 2,
    "device": "cpu",
}


def chat(
    engine: Engine,
    users: int,
    rounds: int,
    seed: int = 0,
    system_len: int = 24,
    turn_len: tuple[int, int] = (3, 20),
    answer_len: tuple[int, int] = (1, 8),
) -> list[Request]:
    """Run ``rounds`` rounds of ``users`` conversations sharing a system prompt; all requests."""
    rng = random.Random(seed)
    vocab = engine.model.cfg.vocab_size
    system = [rng.randrange(vocab) for _ in range(system_len)]
    history = [list(system) for _ in range(users)]
    done: list[Request] = []
    for _ in range(rounds):
        reqs = []
        for u in range(users):
            history[u] += [rng.randrange(vocab) for _ in range(rng.randint(*turn_len))]
            reqs.append(engine.submit(history[u], rng.randint(*answer_len)))
        engine.run()
        for u, req in enumerate(reqs):
            assert req.status is Status.FINISHED, req.error
            history[u] = req.origin_input_ids + req.output_ids
        done += reqs
        engine.cache.check_invariants()
    return done


def assert_matches_reference(
    engine: Engine, reqs: list[Request], atol: float, margin: float = 0.0
) -> None:
    """Every generated token's logits equal a cache-free full prefill's within ``atol``, and
    so does the greedy choice wherever the reference's top-2 gap exceeds ``margin``."""
    for req in reqs:
        seq = req.origin_input_ids + req.output_ids[:-1]
        ref = reference_logits(engine.model, seq)[len(req.origin_input_ids) - 1 :]
        torch.testing.assert_close(torch.stack(req.logits), ref, atol=atol, rtol=0)
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > margin
        got = torch.tensor(req.output_ids, device=ref.device)
        assert torch.equal(got[clear], ref.argmax(-1)[clear])


def assert_no_leak(engine: Engine) -> None:
    """Idle engine: every device slot is free or owned by the tree, every row is free."""
    cache, alloc = engine.cache, engine.allocator
    assert cache.protected_size() == 0
    assert alloc.available_size() + cache.total_size() == alloc.size
    assert engine.req_to_token_pool.available_size() == engine.req_to_token_pool.size


class LoadSpy:
    """Wraps a ``LayerDoneCounter`` to record, per forward pass, the load batch it was told to
    consume (``set_consumer``) and the layers whose buffers it then waited for, in order."""

    def __init__(self, counter: Any) -> None:
        self.passes: list[tuple[int, list[int]]] = []
        set_consumer, wait_until = counter.set_consumer, counter.wait_until

        def on_set_consumer(index: int) -> None:
            self.passes.append((index, []))
            set_consumer(index)

        def on_wait_until(layer: int) -> None:
            if self.passes:
                self.passes[-1][1].append(layer)
            wait_until(layer)

        counter.set_consumer, counter.wait_until = on_set_consumer, on_wait_until

    def assert_layer_wise(self, num_layers: int) -> None:
        """Some pass consumed a load batch, and every such pass waited for each layer in
        order, right before that layer's attention read the pool."""
        loaded = [layers for index, layers in self.passes if index >= 0]
        assert loaded, "no forward pass waited on a host-to-device load batch"
        for layers in loaded:
            assert layers == sorted(layers) and set(layers) == set(range(num_layers)), layers

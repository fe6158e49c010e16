"""Multi-turn chat driver and the from-scratch comparison shared by the engine tests."""

from __future__ import annotations

import random

import torch

from hicache.engine import Engine, Request, Status
from hicache.model import reference_logits


def chat(
    engine: Engine, users: int, rounds: int, seed: int = 0, system_len: int = 24,
    turn_len: tuple[int, int] = (3, 20), answer_len: tuple[int, int] = (1, 8),
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

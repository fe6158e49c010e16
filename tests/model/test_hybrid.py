"""Hybrid layer patterns: one prefill, chunked prefill and decode agree; a checkpointed prefix
resumes exactly."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import checkpoint_states, restore_states
from tests.model.hybrid_harness import (
    DEVICES,
    PATTERNS,
    Harness,
    hybrid_config,
    random_prompt,
)

CASES = [(p, a, ps) for p in PATTERNS for a in ("mha", "mla") for ps in (1, 16)]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]
N = 70  # crosses the linear layer's 64-token block and many windows of 8
DECODE = 26
TOL = {"atol": 2e-5, "rtol": 0}


def one_prefill(h: Harness, prompt: list[int]) -> torch.Tensor:
    return h.step([h.open()], [prompt])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_chunked_prefill_and_decode_match_one_prefill(
    pattern: str, attention: str, page: int, device: str
) -> None:
    cfg = hybrid_config(pattern, attention)
    prompts = [random_prompt(cfg, N, 1), random_prompt(cfg, N - 9, 2)]
    h = Harness(cfg, page, device)
    whole = [one_prefill(h, p) for p in prompts]
    assert not any(w.isnan().any() for w in whole)
    rows = [h.open(), h.open()]  # two requests batched, chunks cut at different places
    cuts = [[0, 1, 8, 40, 41, N], [0, 5, 6, 50, 50, N - 9]]
    chunked: list[list[torch.Tensor]] = [[], []]
    for k in range(len(cuts[0]) - 1):
        spans = [(c[k], c[k + 1]) for c in cuts]
        live = [i for i, (a, b) in enumerate(spans) if b > a]
        out = h.step([rows[i] for i in live], [prompts[i][slice(*spans[i])] for i in live])
        sizes = [spans[i][1] - spans[i][0] for i in live]
        for i, part in zip(live, out.split(sizes), strict=True):
            chunked[i].append(part)
    for i in range(2):
        torch.testing.assert_close(torch.cat(chunked[i]), whole[i], **TOL)
    row = h.open()  # token by token past a few windows, then the rest in one chunk
    decoded = [h.step([row], [[t]]) for t in prompts[0][:DECODE]]
    decoded.append(h.step([row], [prompts[0][DECODE:]]))
    torch.testing.assert_close(torch.cat(decoded), whole[0], **TOL)


def drop_outside_window(h: Harness, row: int, keep_from: int) -> None:
    """Give back what a cache would drop of ``row``'s first ``keep_from`` tokens (whole pages):
    SWA KV slots with an ``SWAKVPool``; the token slots themselves (NaN-poisoned) when no
    layer is full attention."""
    ps, cfg = h.page_size, h.cfg
    drop = torch.tensor(h.slots[row][: keep_from // ps * ps], dtype=torch.int64, device=h.device)
    if "F" in cfg.layer_kinds and "S" in cfg.layer_kinds:
        h.pools.allocator.free_swa(drop)
    elif "F" not in cfg.layer_kinds:
        h.pools.allocator.free(drop)
        for layer in cfg.layers_of("S"):
            h.pools.kv.get_key_buffer(layer)[drop] = torch.nan
            h.pools.kv.get_value_buffer(layer)[drop] = torch.nan


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_restored_checkpoint_matches_cold(
    pattern: str, attention: str, page: int, device: str
) -> None:
    cfg = hybrid_config(pattern, attention)
    prompt, m = random_prompt(cfg, 50, 3), 32
    h = Harness(cfg, page, device)
    cold = one_prefill(h, prompt)
    first = h.open()
    h.step([first], [prompt[:m]])
    states = h.pools.states
    ckpt = checkpoint_states(states, [first]) if states is not None else None
    prefix = h.slots.pop(first)
    if states is not None:
        dead = states.state_slot(first)
        states.free(first)  # its state slot goes back, poisoned: only the checkpoint remains
        for t in states.mamba_pool.mamba_cache.tensors():
            t[:, dead] = torch.nan
    else:
        h.pools.req_to_token.free(first)
    h.slots[first] = prefix
    drop_outside_window(h, first, m + 1 - cfg.sliding_window)
    row = h.open()
    h.pools.req_to_token.write((row, slice(0, m)), torch.tensor(prefix).int())
    h.slots[row] = list(prefix)
    if ckpt is not None:
        restore_states(states, ckpt, [row])
    warm = h.step([row], [prompt[m:]])
    torch.testing.assert_close(warm, cold[m:], **TOL)

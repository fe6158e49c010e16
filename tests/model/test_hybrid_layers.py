"""Each hybrid layer against a plain-torch reference: sliding-window attention masked to its
window, the linear layer as a token-by-token loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hicache.engine.checks import check_model
from hicache.model import ForwardBatch, ModelConfig, reference_logits
from hicache.model.attention import MHAAttention, MLAAttention
from hicache.model.context import ForwardContext
from hicache.model.layers import apply_rope
from hicache.model.linear import LinearRecurrence
from tests.model.hybrid_harness import Harness, hybrid_config, random_prompt
from tests.model.test_model import RecordingCounter

CHUNKS = (13, 58, 1, 8)  # crosses the 64-token block; prefixes longer than the window


def run_layer(h: Harness, layer_id: int, x: torch.Tensor) -> torch.Tensor:
    """Layer ``layer_id``'s token mixer over ``x`` ``[n, hidden]`` fed as one request's
    chunks ``CHUNKS``; its outputs, concatenated."""
    row, outs, start = h.open(), [], 0
    mixer = h.model.layers[layer_id].attn
    for n in CHUNKS:
        slots = h.take(row, n)
        h.pools.req_to_token.write((row, slice(start, start + n)), torch.tensor(slots).int())
        table, loc = h.pools.req_to_token.req_to_token, torch.tensor(slots)
        ids = [[0] * n]  # only the positions and slots matter here
        batch = ForwardBatch.build(table, [row], [start], ids, loc, "cpu")
        ctx = ForwardContext.build(h.cfg, batch, h.pools.kv, h.pools.states)
        outs.append(mixer(x[start : start + n], ctx))
        start += n
    return torch.cat(outs)


def mha_qkv(m: MHAAttention, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n, theta = x.shape[0], m.cfg.rope_theta
    q = apply_rope(m.q_proj(x).view(n, m.heads, -1), pos, theta)
    k = apply_rope(m.k_proj(x).view(n, m.kv_heads, -1), pos, theta)
    group = m.heads // m.kv_heads
    v = m.v_proj(x).view(n, m.kv_heads, -1)
    return q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)


def mla_qkv(m: MLAAttention, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
    cfg, n, r = m.cfg, x.shape[0], m.cfg.kv_lora_rank
    q = m.q_proj(x).view(n, m.heads, -1)
    q_rope = apply_rope(q[..., cfg.head_dim :], pos, cfg.rope_theta)
    q = torch.cat([q[..., : cfg.head_dim], q_rope], -1)
    latent = m.kv_a(x)
    c = m.kv_norm(latent[:, :r])
    k_rope = apply_rope(latent[:, None, r:], pos, cfg.rope_theta).expand(n, m.heads, -1)
    k = torch.cat([m.k_up(c).view(n, m.heads, -1), k_rope], -1)
    return q, k, m.v_up(c).view(n, m.heads, -1)


@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("page", [1, 16])
def test_sliding_window_attention_matches_masked_reference(attention: str, page: int) -> None:
    h = Harness(hybrid_config("FS", attention), page)
    n, w = sum(CHUNKS), h.cfg.sliding_window
    x = torch.randn(n, h.cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    got = run_layer(h, 1, x)
    mixer = h.model.layers[1].attn
    pos = torch.arange(n)
    qkv = (mla_qkv if attention == "mla" else mha_qkv)(mixer, x, pos)  # type: ignore[arg-type]
    q, k, v = (t.transpose(0, 1) for t in qkv)
    scores = q @ k.transpose(1, 2) * q.shape[-1] ** -0.5
    sees = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - w)
    out = scores.masked_fill(~sees, -torch.inf).softmax(-1) @ v
    want = mixer.o_proj(out.transpose(0, 1).reshape(n, -1))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def loop_reference(m: LinearRecurrence, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer token by token from a zero state: (outputs ``[n, hidden]``, final state)."""
    cfg, heads = m.cfg, m.heads
    inputs = m.x_proj(x)
    window = torch.zeros(inputs.shape[1], cfg.conv_kernel)
    h = torch.zeros(heads, cfg.head_dim, cfg.linear_state_size)
    ys = []
    for t in range(x.shape[0]):
        window = torch.cat([window[:, 1:], inputs[t, :, None]], 1)
        u = F.silu((window * m.conv_weight).sum(1)).view(heads, -1)
        a = torch.sigmoid(m.a_proj(x[t]))
        b, c = m.b_proj(x[t]).view(heads, -1), m.c_proj(x[t]).view(heads, -1)
        h = a[:, None, None] * h + u[:, :, None] * b[:, None, :]
        ys.append((h * c[:, None, :]).sum(-1).reshape(-1))
    y = torch.stack(ys) * F.silu(m.z_proj(x))
    return m.out_proj(y), h


@pytest.mark.parametrize("pattern", ["L", "FL"])
def test_linear_layer_matches_sequential_loop(pattern: str) -> None:
    h = Harness(hybrid_config(pattern, "mha"), 1)
    layer = len(pattern) - 1
    x = torch.randn(sum(CHUNKS), h.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    got = run_layer(h, layer, x)
    mixer = h.model.layers[layer].attn
    assert isinstance(mixer, LinearRecurrence)
    want, state = loop_reference(mixer, x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    states = h.pools.states
    assert states is not None
    slot = states.state_slot(0)
    temporal = states.mamba2_layer_cache(layer).temporal[slot]
    torch.testing.assert_close(temporal, state, atol=1e-5, rtol=1e-5)


def test_config_rejects_bad_patterns() -> None:
    for bad in ({"layer_pattern": "FX"}, {"layer_pattern": "FSL"}, {"conv_kernel": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ModelConfig(num_layers=2, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sliding_window"):
        ModelConfig(sliding_window=0)
    with pytest.raises(TypeError, match="layer_pattern"):
        ModelConfig(layer_pattern=["F", "F"])  # type: ignore[arg-type]
    cfg = ModelConfig(num_layers=3, layer_pattern="FSL")
    assert (cfg.layers_of("FS"), cfg.layers_of("L"), cfg.is_hybrid) == ([0, 1], [2], True)
    assert not ModelConfig(num_layers=2, layer_pattern="FF").is_hybrid


def test_missing_pools_and_the_engine_are_clear_errors() -> None:
    h = Harness(hybrid_config("FL", "mha"), 1)
    row = h.open()
    table, loc = h.pools.req_to_token.req_to_token, torch.tensor(h.take(row, 2))
    batch = ForwardBatch.build(table, [row], [0], [[1, 2]], loc, "cpu")
    with pytest.raises(ValueError, match="states"):
        h.model(batch, h.pools.kv)
    with pytest.raises(ValueError, match="pool"):
        h.model(batch, None, states=h.pools.states)
    check_model(h.model)  # the engine serves hybrid models (tests/engine/test_engine_hybrid.py)
    with pytest.raises(TypeError, match="model must be a TinyTransformer"):
        check_model(h.pools)


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_every_layer_kind_waits_for_its_layer_in_order(attention: str) -> None:
    h = Harness(hybrid_config("FSLFSL", attention), 16)
    counter = RecordingCounter()
    h.pools.kv.register_layer_transfer_counter(counter)
    assert h.pools.states is not None
    h.pools.states.register_layer_transfer_counter(counter)
    prompt = random_prompt(h.cfg, 20, 6)
    logits = h.step([h.open()], [prompt])
    assert counter.waits == sorted(counter.waits)
    assert sorted(set(counter.waits)) == list(range(6))
    torch.testing.assert_close(logits, reference_logits(h.model, prompt), atol=2e-5, rtol=0)

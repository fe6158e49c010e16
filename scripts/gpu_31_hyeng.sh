#!/usr/bin/env bash
# Issue 31, engine: a hybrid model's second turn served from a device hit, and from a host hit
# (the first turn evicted to the host tier), equals the same request computed cold, on CUDA
# (fp32), for FSL/FSLFSL x MHA/MLA x pages 1/16/64; at pages 16 and 64 a first turn ending
# mid-page (20 + 20 and 100 + 40 tokens: the state tracked in decode at 32 / 128 serves the hit).
# Run in the repo root: OUT=/some/dir bash scripts/gpu_31_hyeng.sh  (well under a minute)
set -euo pipefail
OUT=${OUT:-/tmp}
PYTHONPATH=. "${PYTHON:-python3}" - <<'PY' | tee "$OUT/gpu_31_hyeng.txt"
import torch

from hicache.engine import CacheSpec, EngineConfig, build_engine
from hicache.model import ModelConfig, TinyTransformer

DEV = "cuda" if torch.cuda.is_available() else "cpu"
print(f"device {DEV}")
print(f"{'tier':7} {'pattern':8} {'attn':4} {'page':>4} {'turn':>5} {'hit':>4} {'max |diff|':>11} ok")
bad = 0
# first turn, answer, hit wanted
TURNS = {1: [(40, 9, 48)], 16: [(40, 9, 48), (20, 20, 32)], 64: [(100, 40, 128)]}
for kind, pattern, attention, page, (first_len, answer, want) in [
    (k, p, a, ps, t)
    for k in ("radix", "hiradix")
    for p in ("FSL", "FSLFSL")
    for a in ("mha", "mla")
    for ps in (1, 16, 64)
    for t in TURNS[ps]
]:
    heads = {"num_kv_heads": 1} if attention == "mla" else {}
    cfg = ModelConfig(num_layers=len(pattern), layer_pattern=pattern, attention=attention,
                      sliding_window=8, linear_state_size=4, **heads)
    model = TinyTransformer(cfg, DEV)
    spec = CacheSpec(kind=kind, device_tokens=512, page_size=page, max_context_len=256,
                     max_requests=4)

    def serve(eng, prompt, new):
        req = eng.submit(prompt, new)
        eng.run()
        return req

    gen = torch.Generator().manual_seed(1)
    eng = build_engine(model, spec, EngineConfig(record_logits=True))
    first = serve(eng, torch.randint(0, cfg.vocab_size, (first_len,), generator=gen).tolist(), answer)
    more = torch.randint(0, cfg.vocab_size, (20,), generator=gen).tolist()
    if kind == "hiradix":  # the first turn to the host tier
        eng.cache.drain_transfers()
        eng.cache.evict(eng.cache.evictable_size())
    prompt = first.origin_input_ids + first.output_ids + more
    warm = serve(eng, prompt, 5)
    cold = serve(build_engine(model, spec, EngineConfig(record_logits=True)), prompt, 5)
    diff = (torch.stack(warm.logits) - torch.stack(cold.logits)).abs().max().item()
    hit = warm.device_hit + warm.host_hit
    ok = hit == want and diff <= 1e-4 and warm.output_ids == cold.output_ids
    ok = ok and (warm.host_hit == want) == (kind == "hiradix")
    bad += not ok
    turn = f"{first_len}+{answer}"
    print(f"{kind:7} {pattern:8} {attention:4} {page:>4} {turn:>5} {hit:>4} {diff:>11.2e} {ok}")
print("ALL OK" if not bad else f"{bad} FAILED")
raise SystemExit(1 if bad else 0)
PY

"""What each TP rank runs in the tests (module level: the launcher pickles it by name)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hicache.engine import CacheSpec, Engine, EngineConfig, build_engine
from hicache.model import ModelConfig, TinyTransformer, TPShard
from hicache.radix import HiCacheConfig
from hicache.tp import TPGroup
from tests.engine.helpers import chat

MHA = ModelConfig(attention="mha", num_heads=4, num_kv_heads=2, num_layers=3, seed=3)
MLA = ModelConfig(attention="mla", num_heads=4, num_kv_heads=1, num_layers=3, seed=4)
# Small enough a device pool that conversations go to the host tier and come back.
SPEC = CacheSpec(
    kind="hiradix",
    device_tokens=64,
    page_size=2,
    max_context_len=160,
    max_requests=4,
    hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=2),
)
ENGINE = EngineConfig(max_running_requests=3, max_prefill_tokens=48, record_logits=True)
USERS, ROUNDS = 4, 3


def run_chat(engine: Engine, seed: int = 5) -> dict[str, Any]:
    """The test chat through ``engine``: every request's tokens, hits and logits (numpy: the
    launcher cannot send tensors back)."""
    reqs = chat(engine, USERS, ROUNDS, seed=seed, turn_len=(3, 14), answer_len=(1, 5))
    return {
        "tokens": [r.output_ids for r in reqs],
        "hits": [(r.device_hit, r.host_hit, r.computed) for r in reqs],
        "logits": [torch.stack(r.logits).numpy() for r in reqs],
    }


def shard_blocks(cfg: ModelConfig, model: TinyTransformer) -> list[str]:
    """Names of the weights of ``model`` (a shard) that are not the exact block of the
    one-rank model's weights they should be: column-parallel rows, row-parallel columns."""
    full = dict(TinyTransformer(cfg).named_parameters())
    bad = []
    for name, weight in model.named_parameters():
        whole = full[name]
        if weight.shape == whole.shape:
            block = whole
        elif weight.shape[0] != whole.shape[0]:
            block = whole[model.shard.part(whole.shape[0])]
        else:
            block = whole[:, model.shard.part(whole.shape[1])]
        if not torch.equal(weight, block):
            bad.append(name)
    return bad


def fail_calls(
    fn: Callable[..., Any],
    calls: set[int],
    failed: list[int],
    count: Iterator[int] | None = None,
) -> Callable[..., Any]:
    """``fn`` but returning None (out of memory) at the given 1-based call numbers, each
    noted in ``failed``; ``count`` numbers the calls (shared by functions that draw on one
    budget), a fresh counter by default."""
    count = itertools.count(1) if count is None else count

    def flaky(*args: Any, **kwargs: Any) -> Any:
        n = next(count)
        if n in calls:
            failed.append(n)
            return None
        return fn(*args, **kwargs)

    return flaky


def tp_checks(group: Any) -> dict[str, Any]:
    """Everything the engine test checks on each rank, in one launch."""
    torch.set_num_threads(1)
    shard = TPShard.of(group)
    out: dict[str, Any] = {"rank": shard.rank}
    for name, cfg in (("mha", MHA), ("mla", MLA)):
        model = TinyTransformer(cfg, "cpu", shard)
        out[f"{name} bad blocks"] = shard_blocks(cfg, model)
        engine = build_engine(model, SPEC, ENGINE, tp_group=TPGroup(group, debug=True))
        out[f"{name} pool"] = tuple(engine.kv_pool.get_key_buffer(0).shape)
        out[name] = run_chat(engine)
    out["faults"] = faulty_run(group, shard)
    out["host hits"] = host_hit_steps(group, shard)
    try:
        build_engine(TinyTransformer(MHA), SPEC, ENGINE, tp_group=group)
    except ValueError as exc:
        out["one-rank model in a TP cache"] = str(exc)
    return out


def faulty_run(group: Any, shard: TPShard) -> dict[str, Any]:
    """The chat with rank 1's own allocations failing now and then: slots (retried after a
    drain) and request rows (admission deferred). Every rank must still take the same branch."""
    model = TinyTransformer(MHA, "cpu", shard)
    engine = build_engine(model, SPEC, ENGINE, TPGroup(group, debug=True))
    failed: list[int] = []
    if shard.rank == 1:
        allocator, rows = engine.allocator, engine.req_to_token_pool
        slots = itertools.count(1)  # loads take slots with their CPU copy (alloc_pair)
        allocator.alloc = fail_calls(allocator.alloc, {3, 9, 30}, failed, slots)  # type: ignore[method-assign]
        allocator.alloc_pair = fail_calls(allocator.alloc_pair, {3, 9, 30}, failed, slots)  # type: ignore[method-assign]
        rows.alloc = fail_calls(rows.alloc, {2, 5}, failed)  # type: ignore[method-assign]
    return {**run_chat(engine, seed=6), "failed": len(failed)}


def offloaded(engine: Engine) -> int:
    """Land every transfer, evict every unlocked device entry (backed up: kept on the host);
    returns the device slots free or held by the tree (all of them when no request runs)."""
    engine.cache.drain_transfers()
    engine.cache.check_hicache_events()
    engine.cache.evict(engine.allocator.size)
    return engine.allocator.available_size() + engine.cache.total_size()


def host_hit_steps(group: Any, shard: TPShard) -> dict[str, Any]:
    """Requests whose prefix is a host-only hit: the collectives of each step, with nothing
    failing, then with rank 1's request row failing at the admission (with its load-back: one
    agreement), then with its step slots failing (agreed with the load issue's settle)."""
    engine = build_engine(TinyTransformer(MHA, "cpu", shard), SPEC, ENGINE, TPGroup(group))
    prefix = list(range(1, 33))
    engine.submit(prefix, 1)
    engine.run()
    out: dict[str, Any] = {"held": [offloaded(engine)], "steps": [], "hits": [], "failed": []}
    rows, allocator = engine.req_to_token_pool, engine.allocator
    for i, part in enumerate((None, rows, allocator)):
        patched = part is not None and shard.rank == 1
        if patched:
            part.alloc = fail_calls(part.alloc, {1}, out["failed"])  # type: ignore[union-attr]
        req = engine.submit([*prefix, 40 + i, 41, 42], 1)
        steps = []
        while engine.has_work():
            before = engine.tp.collectives
            engine.step()
            steps.append(engine.tp.collectives - before)
        if patched:
            del part.alloc  # the class's again
        out["steps"].append(steps)
        out["hits"].append((req.device_hit, req.host_hit, req.output_ids))
        out["held"].append(offloaded(engine))
    out["digest"] = engine.cache.tree_digest().hex()
    return out

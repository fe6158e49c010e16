"""The peer's per-call match and insert rows with fresh int objects in every request's token list.

Run (either tree, through the adapters of ``shared/peer/bench_radix_peer.py``, found beside the
checkout or one level up): ``PYTHONPATH=$PWD python benchmarks/peer_fresh_ids.py hicache`` and
``/work/sglang-venv/bin/python benchmarks/peer_fresh_ids.py sglang``.

``bench_radix_peer.py`` matches with the very list it inserted, and its insert row's lists share
one prefix list's int objects, so SGLang's list compare settles every id on object identity. A
tokenizer gives each request its own int objects; this probe times both cases (wall time,
medians) with equal values: ``same`` reuses the cached list's objects, ``fresh`` is a copy made
through numpy (new objects).
"""

from __future__ import annotations

import gc
import statistics
import sys
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
_PEER = next(
    p for p in (_ROOT.parent / "shared/peer", _ROOT.parents[1] / "shared/peer") if p.is_dir()
)
sys.path.insert(0, str(_PEER))

import bench_radix_peer as peer  # noqa: E402


def fresh(ids: list[int]) -> list[int]:
    return np.array(ids).tolist()  # equal values, new int objects


def match_us(make: object, page: int, ids: list[int], same: bool) -> float:
    cache = make(page)  # type: ignore[operator]
    cache.insert(ids, peer.Values(len(ids) + 64).take(len(ids)))
    query = ids if same else fresh(ids)
    for _ in range(3):
        cache.match(query)
    with peer.quiet_gc():
        times = [peer.timed(cache.match, query)[0] for _ in range(15)]
    return statistics.median(times) * 1e6


def insert_us(make: object, page: int, rng: np.random.Generator, same: bool) -> float:
    prefix = peer.rand_tokens(rng, 1024)
    seqs = [(prefix if same else fresh(prefix)) + peer.rand_tokens(rng, 1024) for _ in range(2000)]
    cache, values = make(page), peer.Values(2000 * 2048 + 64)  # type: ignore[operator]
    slots = [values.take(2048) for _ in seqs]
    gc.collect()
    with peer.quiet_gc():
        times = [peer.timed(cache.insert, s, v)[0] for s, v in zip(seqs, slots, strict=True)]
    return statistics.median(times) * 1e6


def main() -> None:
    impl = sys.argv[1] if len(sys.argv) > 1 else "hicache"
    make, _ = peer.IMPLS[impl]()
    import torch

    torch.set_num_threads(1)  # as bench_radix_peer.py does: the trees' tensor ops are tiny
    rng = np.random.default_rng(1)
    ids = peer.rand_tokens(rng, 131_072)
    for page in (1, 16, 64):
        m = [match_us(make, page, ids, same) for same in (True, False)]
        i = [insert_us(make, page, rng, same) for same in (True, False)]
        print(
            f"{impl} page {page}: match 128k same {m[0]:.0f} us, fresh {m[1]:.0f} us; "
            f"insert 2k same {i[0]:.1f} us, fresh {i[1]:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()

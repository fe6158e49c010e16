"""The ideal hit rate of a trace: an infinite cache, computed from the hash ids alone.

Independent of the tree: one pass over the requests in arrival order with a dict of the blocks
seen so far. A request's ideal hit is its leading run of blocks seen in an earlier request (a
block seen shorter than it is now, a partial last block, counts for the tokens seen), capped at
``input_length - 1`` (the last prompt token is always computed, as in the replay and SGLang)
and rounded down to whole pages (the tree caches whole pages). With page sizes dividing the
block size this is exactly what an infinite ``HiRadixCache`` serves.
"""

from __future__ import annotations

from collections.abc import Sequence

from hicache.replay.trace import TraceRequest


def _leading_run(req: TraceRequest, seen: dict[int, int], block_tokens: int) -> int:
    """Tokens of the leading blocks of ``req`` already seen (``seen``: hash -> longest length)."""
    run = 0
    for i, h in enumerate(req.hash_ids):
        length = min(block_tokens, req.input_length - i * block_tokens)
        have = seen.get(h, 0)
        run += min(length, have)
        if have < length:
            break
    return run


def ideal_hits(requests: Sequence[TraceRequest], block_tokens: int, page_size: int) -> list[int]:
    """Per request (in the order given, which is arrival order), the prompt tokens an infinite
    cache with pages of ``page_size`` tokens serves."""
    seen: dict[int, int] = {}
    hits = []
    for req in requests:
        run = min(_leading_run(req, seen, block_tokens), req.input_length - 1)
        hits.append(run - run % page_size)
        for i, h in enumerate(req.hash_ids):
            length = min(block_tokens, req.input_length - i * block_tokens)
            if seen.get(h, 0) < length:
                seen[h] = length
    return hits

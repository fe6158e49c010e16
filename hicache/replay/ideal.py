"""The ideal hit rates of a trace, computed from the hash ids alone (a dict of the blocks seen
so far, one pass over the requests in arrival order), independent of the tree.

- **Reachable ideal** (``ideal_hits``, the hit rule of ``HIT_RULE``): an infinite cache as the
  replay and SGLang serve it. A request's hit is its leading run of blocks seen in an earlier
  request (a block seen shorter than it is now, a partial last block, counts for the tokens
  seen), capped at ``input_length - 1`` (the last prompt token is always computed) and rounded
  down to whole pages (the tree caches whole pages). With page sizes dividing the block size
  this is exactly what an infinite ``HiRadixCache`` serves.
- **Block ideal** (``block_ideal_hits``): every block seen in an earlier request, its tokens
  seen, no cap, no rounding, no capacity: the figure trace studies quote. Mooncake's hash ids
  hash the whole prefix, so on such traces the seen blocks are the leading run and the two
  differ only by the last token and the page rounding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hicache.replay.trace import TraceRequest

HIT_RULE = "reachable ideal: the last prompt token is never matched, hits round down to pages"
BLOCK_RULE = "block ideal: every block seen before, no rounding, no capacity"


def _blocks(req: TraceRequest, block_tokens: int) -> Iterator[tuple[int, int]]:
    """``(hash, tokens)`` of each block of ``req`` (the last one may be partial)."""
    for i, h in enumerate(req.hash_ids):
        yield h, min(block_tokens, req.input_length - i * block_tokens)


def _leading_run(req: TraceRequest, seen: dict[int, int], block_tokens: int) -> int:
    """Tokens of the leading blocks of ``req`` already seen (``seen``: hash -> longest length)."""
    run = 0
    for h, length in _blocks(req, block_tokens):
        have = seen.get(h, 0)
        run += min(length, have)
        if have < length:
            break
    return run


def _see(req: TraceRequest, seen: dict[int, int], block_tokens: int) -> None:
    for h, length in _blocks(req, block_tokens):
        if seen.get(h, 0) < length:
            seen[h] = length


def ideal_hits(requests: Sequence[TraceRequest], block_tokens: int, page_size: int) -> list[int]:
    """Per request (in the order given, which is arrival order), the prompt tokens an infinite
    cache with pages of ``page_size`` tokens serves (the reachable ideal)."""
    seen: dict[int, int] = {}
    hits = []
    for req in requests:
        run = min(_leading_run(req, seen, block_tokens), req.input_length - 1)
        hits.append(run - run % page_size)
        _see(req, seen, block_tokens)
    return hits


def block_ideal_hits(requests: Sequence[TraceRequest], block_tokens: int) -> list[int]:
    """Per request (arrival order), the tokens of its blocks seen in an earlier request."""
    seen: dict[int, int] = {}
    hits = []
    for req in requests:
        hits.append(sum(min(n, seen.get(h, 0)) for h, n in _blocks(req, block_tokens)))
        _see(req, seen, block_tokens)
    return hits

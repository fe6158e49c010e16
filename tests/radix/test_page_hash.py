"""The page hash: SGLang's per-page bytes, chained, namespaced, computed once per node."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hicache.radix import RadixCache, RadixKey
from hicache.radix.page_hash import namespace_seed, node_hashes, page_hashes


def reference_hashes(tokens: list[int], page_size: int, prior: bytes | None) -> list[bytes]:
    """SGLang's ``get_hash_str`` per full page, token by token (digests, not hex)."""
    out = []
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(prior)
        for t in tokens[start : start + page_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = hasher.digest()
        out.append(prior)
    return out


def ids(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("prior", [None, b"\x07" * 32])
def test_page_hashes_equal_the_per_token_reference(page_size: int, prior: bytes | None) -> None:
    rng = np.random.default_rng(page_size)
    tokens = rng.integers(0, 2**31 - 1, 6 * page_size - 1).tolist()  # partial last page ignored
    got = page_hashes(ids(tokens), page_size, prior)
    assert got == reference_hashes(tokens, page_size, prior)
    assert len(got) == 5 and all(len(h) == 32 for h in got)


def test_chain_property_a_suffix_chains_from_the_last_prefix_hash() -> None:
    tokens = list(range(40))
    whole = page_hashes(ids(tokens), 4, None)
    head = page_hashes(ids(tokens[:16]), 4, None)
    tail = page_hashes(ids(tokens[16:]), 4, head[-1])
    assert head + tail == whole
    changed = page_hashes(ids([99] + tokens[1:]), 4, None)
    assert all(a != b for a, b in zip(changed, whole, strict=True))  # a page names its prefix


def test_namespaces_separate_chains_and_none_is_unseeded() -> None:
    assert namespace_seed(None) is None
    keys = [1, "1", b"1", (1,), ("a", "bc"), ("ab", "c"), (), (None,), "", b"", 0, -1, 255]
    seeds = [namespace_seed(k) for k in keys]
    assert len(set(seeds)) == len(keys)  # every namespace its own seed
    assert namespace_seed(("a", ("b", 2))) == namespace_seed(("a", ("b", 2)))  # by value
    tokens = ids(list(range(8)))
    chains = {tuple(page_hashes(tokens, 4, s)) for s in [None, *seeds]}
    assert len(chains) == len(keys) + 1


def test_deeply_nested_namespace_is_framed_without_recursion() -> None:
    key: object = 1
    for _ in range(5000):
        key = (key,)
    assert namespace_seed(key) is not None  # type: ignore[arg-type]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="extra_key"):
        namespace_seed(("a", 1.5))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ids"):
        page_hashes([1, 2], 1, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="page_size"):
        page_hashes(ids([1, 2]), 0, None)


def cache_with(*seqs: list[int], extra_key: object = None) -> RadixCache:
    cache = RadixCache(None, None, 2, enable_kv_events=True)
    for seq in seqs:
        cache.insert(RadixKey(seq, extra_key))
    return cache


def test_nodes_hash_their_root_path_once_and_split_divides_the_hashes() -> None:
    cache = cache_with(list(range(8)), extra_key="tenant")
    (node,) = cache.root.children.values()
    seed = namespace_seed("tenant")
    whole = reference_hashes(list(range(8)), 2, seed)
    assert node.hash_value == whole
    cache.insert(RadixKey([0, 1, 2, 3, 9, 9], "tenant"))  # splits the node after 2 pages
    (upper,) = cache.root.children.values()
    assert upper.hash_value == whole[:2] and node.hash_value == whole[2:]
    (branch,) = [c for c in upper.children.values() if c is not node]
    assert branch.hash_value == reference_hashes([0, 1, 2, 3, 9, 9], 2, seed)[2:]


def test_events_off_computes_nothing_until_asked() -> None:
    cache = RadixCache(None, None, 2)
    cache.insert(RadixKey(list(range(8))))
    cache.insert(RadixKey([0, 1, 5, 5]))
    nodes = list(cache.tree.nodes())
    assert len(nodes) == 3 and all(n.hash_value is None for n in nodes)
    deepest = next(n for n in nodes if not n.children and len(n.key) == 6)
    assert node_hashes(deepest, 2) == reference_hashes(list(range(8)), 2, None)[1:]
    assert deepest.parent is not None and deepest.parent.hash_value is not None  # filled lazily
    assert cache.take_events() == []

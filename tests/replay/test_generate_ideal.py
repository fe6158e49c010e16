"""The generator's sharing and the independent ideal hit rate, against closed forms."""

import pytest

from hicache.replay import GenerateSpec, TraceRequest, generate_trace, ideal_hits
from hicache.replay.ideal import block_ideal_hits

B = 512


def _sessions(n, turns, system=B, user=B, out=B):
    spec = GenerateSpec(
        sessions=n,
        turns=turns,
        system_prompts=1,
        system_tokens=system,
        turn_tokens=user,
        output_tokens=out,
        session_rate=2.0,
        turn_gap_s=1000.0,
    )
    return spec, generate_trace(spec)


def test_prompts_grow_by_turn_and_answer():
    spec, reqs = _sessions(3, 4)
    lengths = sorted(r.input_length for r in reqs)
    assert lengths == sorted([B + t * 2 * B + B for t in range(4)] * 3)
    assert all(r.output_length == B for r in reqs)


def test_ideal_matches_the_closed_form():
    """Turn r of a session re-sends turn r-1's prompt; turn 0 shares only the system prompt
    with earlier sessions (the very first request hits nothing)."""
    n, turns = 5, 3
    _, reqs = _sessions(n, turns)
    expected = (n - 1) * B + sum(n * (B + (r - 1) * 2 * B + B) for r in range(1, turns))
    assert sum(ideal_hits(reqs, B, 16)) == expected


def test_ideal_caps_at_the_last_token_and_rounds_to_pages():
    first = TraceRequest(0, 1000, 1, (1, 2))
    again = TraceRequest(1, 1000, 1, (1, 2))
    assert ideal_hits([first, again], B, 16) == [0, 992]  # 999 rounded down to pages
    assert ideal_hits([first, again], B, 512) == [0, 512]


def test_ideal_counts_a_partial_block_for_the_tokens_seen():
    short = TraceRequest(0, 600, 1, (1, 2))
    longer = TraceRequest(1, 1024, 1, (1, 2))  # illegal under prefix hashes, still well defined
    assert ideal_hits([short, longer], B, 8) == [0, 600]


def test_same_spec_same_trace_and_seed_changes_it():
    spec = GenerateSpec(sessions=8, docs=4, system_prompts=3)
    assert generate_trace(spec) == generate_trace(spec)
    assert generate_trace(spec) != generate_trace(GenerateSpec(sessions=8, docs=4, seed=1))


def test_zipf_documents_make_popular_documents_shared():
    reqs = generate_trace(
        GenerateSpec(sessions=200, turns=1, system_prompts=0, docs=20, doc_tokens=B, zipf=1.5)
    )
    first_blocks = [r.hash_ids[0] for r in reqs]
    top = max(set(first_blocks), key=first_blocks.count)
    assert first_blocks.count(top) > 200 / 20 * 3  # the top document far above uniform


def test_bad_spec_names_the_field():
    with pytest.raises(ValueError, match="sessions"):
        GenerateSpec(sessions=0)
    with pytest.raises(TypeError, match="zipf"):
        GenerateSpec(zipf="1")


def test_block_ideal_counts_every_seen_block_without_cap_or_rounding():
    first = TraceRequest(0, 1000, 1, (1, 2))
    again = TraceRequest(1, 1000, 1, (1, 2))
    detour = TraceRequest(2, 1536, 1, (9, 2, 3))  # a seen block after an unseen one counts
    assert block_ideal_hits([first, again, detour], B) == [0, 1000, 488]
    assert ideal_hits([first, again, detour], B, 16) == [0, 992, 0]


def test_long_prompt_preset_makes_twelve_thousand_prompts_of_twelve_thousand_tokens():
    spec = GenerateSpec.preset("long-prompt")
    assert spec.sessions * spec.turns == 12_000
    reqs = generate_trace(GenerateSpec.preset("long-prompt", sessions=25))
    lengths = [r.input_length for r in reqs]
    assert len(reqs) == 100 and (min(lengths), max(lengths)) == (10_880, 13_184)
    assert sum(lengths) / len(lengths) == 12_032


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="long-prompt"):
        GenerateSpec.preset("huge")

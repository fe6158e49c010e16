"""Replays of hybrid models (``--layers-pattern``): the hybrid cache's hits and its states."""

import pytest

from hicache.replay.config import ReplayConfig
from hicache.replay.report import summarize
from hicache.replay.runner import replay
from tests.replay.chat import FAST, TURNS, B, N, chat_trace

# Turn r's ideal hit is turn r-1's whole prompt; turn 0's, the shared system prompt (not the
# first session's).
IDEAL = (N - 1) * B + sum(N * (B + (r - 1) * 2 * B + B) for r in range(1, TURNS))
BIG = {"device_tokens": 1 << 16, "host_ratio": 0.0, **FAST}


def _run(pattern, **cfg):
    kw = {"layers": len(pattern), "layers_pattern": pattern, **cfg}
    return replay(chat_trace(), ReplayConfig(**kw))


def _hit(run):
    return sum(r.device_hit + r.host_hit for r in run.records)


def test_sliding_window_alone_serves_the_ideal_and_has_no_states():
    run = _run("FS", **BIG)
    assert _hit(run) == IDEAL and run.states is None
    assert summarize(run)["states"] is None


@pytest.mark.parametrize("pattern", ["FL", "FSL"])
def test_a_checkpoint_per_finished_request_under_at_finish(pattern):
    run = _run(pattern, checkpoint="finish", **BIG)
    states = summarize(run)["states"]
    # every prompt is page-aligned and distinct: one state each; the next turn resumes from it,
    # but turn 0 finds no state at the end of the shared system prompt
    assert states["checkpoints"] == len(run.records) == N * TURNS
    assert _hit(run) == IDEAL - (N - 1) * B
    assert states["device"]["held_end"] == N * TURNS <= states["device"]["slots"]
    assert states["device"]["peak_bytes"] == states["device"]["held_peak"] * run.config.state_bytes


def test_a_branch_checkpoint_lets_later_sessions_resume_after_the_system_prompt():
    run = _run("FL", checkpoint="finish+branch", **BIG)
    states = summarize(run)["states"]
    assert _hit(run) == IDEAL - B  # only the second session computes the system prompt again
    assert states["checkpoints"] == N * TURNS + 1


def test_held_states_stay_within_the_slots():
    run = _run("FSL", state_slots=8, max_running=2, **BIG)
    device = summarize(run)["states"]["device"]
    assert device["slots"] == 8 and 0 < device["held_peak"] <= 8
    assert device["evicted"] > 0 and 0 < _hit(run) < IDEAL


@pytest.mark.parametrize("pattern", ["FL", "FSL"])
def test_host_tier_hits_on_a_hybrid_model_with_a_small_device_pool(pattern):
    small = {"device_tokens": 4096, "max_running": 2, "load_back_threshold": 0, **FAST}
    device_only = _run(pattern, host_ratio=0.0, **small)
    run = _run(pattern, host_ratio=8.0, **small)
    host = sum(r.host_hit for r in run.records)
    states = summarize(run)["states"]
    assert host > 0 and _hit(run) > _hit(device_only)
    assert states["loaded"] > 0 and states["host"]["held_peak"] > 0
    assert states["loaded_bytes"] == states["loaded"] * run.config.state_bytes
    assert states["host"]["peak_bytes"] == states["host"]["held_peak"] * run.config.state_bytes


def test_the_clock_charges_each_state_loaded_from_the_host():
    small = {"device_tokens": 4096, "max_running": 2, "load_back_threshold": 0, "host_ratio": 8.0}
    light = _run("FL", state_bytes=1, **small, **FAST)
    heavy = _run("FL", state_bytes=10**9, **small, **FAST)  # 0.1 s per state at 10 GB/s
    assert _hit(light) == _hit(heavy) and heavy.states.host.states_loaded > 0
    assert heavy.modelled_s > light.modelled_s


def test_full_attention_by_pattern_is_the_plain_stack():
    run = _run("FF", **BIG)
    assert _hit(run) == IDEAL and run.states is None
    assert run.config.token_bytes == 2 * ReplayConfig(**BIG).token_bytes


@pytest.mark.parametrize("storage", ["memory", "file"])
def test_a_hybrid_model_hits_storage_when_the_host_is_too_small(storage):
    """The small host tier of ``test_storage`` evicts what later turns need: they come back
    from the storage tier, their states included."""
    small = dict(device_tokens=4096, host_ratio=1.5, max_running=2, load_back_threshold=0)
    run = _run("FSL", checkpoint="finish", storage=storage, **small, **FAST)
    assert sum(r.storage_hit for r in run.records) > 0
    assert run.stats.host_components.states_fetched > 0

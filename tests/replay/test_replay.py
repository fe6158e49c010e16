"""Replays through the real HiRadixCache reach the hit rates the trace implies."""

import pytest

from hicache.replay import Trace, TraceRequest
from hicache.replay.config import ReplayConfig
from hicache.replay.runner import replay
from tests.replay.chat import FAST, TURNS, B, N, chat_trace

# Turn r re-sends turn r-1's prompt (system + r-1 turns and answers + its user turn);
# turn 0 shares the system prompt with every earlier session.
IDEAL = (N - 1) * B + sum(N * (B + (r - 1) * 2 * B + B) for r in range(1, TURNS))


def _hits(run):
    rs = run.records
    return sum(r.device_hit for r in rs), sum(r.host_hit for r in rs)


@pytest.mark.parametrize("page", [16, 64, 512])
def test_capacity_above_the_working_set_reaches_the_ideal_exactly(page):
    run = replay(chat_trace(), ReplayConfig(device_tokens=1 << 16, page_size=page, **FAST))
    assert run.ideal_total == IDEAL
    assert _hits(run) == (IDEAL, 0)
    assert run.stats.device.evicted_tokens == 0 and len(run.records) == N * TURNS


def test_concurrent_arrivals_still_see_every_earlier_prompt():
    run = replay(chat_trace(session_rate=0.0, turn_gap_s=0.0), ReplayConfig(max_running=8, **FAST))
    assert sum(_hits(run)) == run.ideal_total > 0


def test_host_tier_serves_what_the_small_device_tier_evicted():
    cfg = ReplayConfig(device_tokens=4096, host_ratio=64, max_running=2, load_back_threshold=0)
    run = replay(chat_trace(), cfg)
    device, host = _hits(run)
    assert run.stats.device.evicted_tokens > 0 and host > 0
    assert device + host == IDEAL
    assert run.stats.transfer is not None
    assert run.stats.transfer.h2d_bytes == host * cfg.token_bytes
    assert run.cost.measured and run.cost.h2d_bytes_per_s > 0


def test_without_a_host_tier_the_evicted_prefixes_are_recomputed():
    small = ReplayConfig(device_tokens=4096, host_ratio=0, max_running=2, **FAST)
    device, host = _hits(replay(chat_trace(), small))
    assert host == 0 and 0 < device < IDEAL


def test_same_trace_same_records():
    cfg = ReplayConfig(device_tokens=4096, host_ratio=8, max_running=3, **FAST)
    first, second = replay(chat_trace(docs=3), cfg), replay(chat_trace(docs=3), cfg)
    assert first.records == second.records and first.modelled_s == second.modelled_s


def test_clock_follows_the_cost_model():
    """One request alone: TTFT = prompt / prefill rate, then output - 1 decode steps."""
    trace = Trace((TraceRequest(0, 1000, 11, (1, 2)),), B)
    run = replay(trace, ReplayConfig(prefill_tps=1000.0, decode_step_ms=10.0, **FAST))
    (rec,) = run.records
    assert rec.ttft_s == pytest.approx(1.0) and rec.finish_s == pytest.approx(1.1)


def test_a_request_longer_than_the_device_pool_is_rejected():
    trace = Trace((TraceRequest(0, 5000, 1, tuple(range(10))), TraceRequest(1, 100, 1, (20,))), B)
    run = replay(trace, ReplayConfig(device_tokens=1024, **FAST))
    errors = [r.error for r in run.records]
    assert errors[0] is not None and "KV slots" in errors[0] and errors[1] is None


def test_ctrl_c_keeps_what_was_measured():
    seen = []

    def stop_after_three(record):
        seen.append(record)
        if len(seen) == 3:
            raise KeyboardInterrupt

    run = replay(chat_trace(), ReplayConfig(**FAST), on_record=stop_after_three)
    assert run.interrupted and len(run.records) == 3 and run.total_requests == N * TURNS


def test_a_trace_ending_in_a_rejected_request_keeps_every_record():
    trace = Trace((TraceRequest(0, 100, 1, (20,)), TraceRequest(1, 5000, 1, tuple(range(10)))), B)
    run = replay(trace, ReplayConfig(device_tokens=1024, **FAST))
    assert [r.error is None for r in run.records] == [True, False]

"""A lean and honest replay: bytes kept per finished request, the last-rejected run's results,
the queueing flag, the memory figures and one bandwidth for a whole sweep."""

import json
import tracemalloc

import pytest

from hicache.__main__ import main
from hicache.replay import Trace, TraceRequest
from hicache.replay import runner as runner_module
from hicache.replay.config import ReplayConfig
from hicache.replay.live import Record
from hicache.replay.load import load_figures
from hicache.replay.runner import replay

B = 512
FAST = {"h2d_gbps": 10.0, "d2h_gbps": 10.0}
FAST_FLAGS = ["--h2d-gbps", "10", "--d2h-gbps", "10", "--no-progress"]


def _unique_prompts(n, tokens=4096, gap_ms=1000):
    """``n`` requests of ``tokens`` prompt tokens sharing nothing, ``gap_ms`` apart."""
    blocks = tokens // B
    return Trace(
        tuple(
            TraceRequest(i * gap_ms, tokens, 2, tuple(range(i * blocks, (i + 1) * blocks)))
            for i in range(n)
        ),
        B,
    )


def test_a_finished_request_keeps_no_prompt_nor_slots():
    """Python memory traced at the 20th and the 60th record: the 40 requests between may keep
    their records, not their 4,096 slots (32 KiB each) nor their prompts (16 KiB)."""
    traced = []
    tracemalloc.start()
    try:
        cfg = ReplayConfig(device_tokens=8192, host_ratio=0, **FAST)
        replay(
            _unique_prompts(60), cfg, lambda _r: traced.append(tracemalloc.get_traced_memory()[0])
        )
    finally:
        tracemalloc.stop()
    per_request = (traced[59] - traced[19]) / 40
    assert per_request < 4096, per_request


def _write(path, requests):
    path.write_text("".join(r.to_json() + "\n" for r in requests))


@pytest.mark.parametrize("first_output", [1, 300], ids=["into-an-idle-replay", "while-decoding"])
def test_a_run_whose_last_request_is_rejected_writes_its_results(tmp_path, capsys, first_output):
    """The request too long for the device pool arrives after the first finished (it was the
    last thing to do: an IndexError once) or while the first still decodes."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "out"
    too_long = TraceRequest(100, 5000, 1, tuple(range(10)))
    _write(trace, [TraceRequest(0, 100, first_output, (20,)), too_long])
    code = main(
        ["replay", str(trace), "--device-tokens", "1024", "--out-dir", str(out), *FAST_FLAGS]
    )
    report = json.loads((out / "replay.json").read_text())
    assert code == 0 and (report["finished"], report["rejected"]) == (1, 1)
    assert "KV slots" in report["first_error"]
    assert "1 finished, 1 rejected" in capsys.readouterr().out


def _record(arrival_s, computed):
    return Record(0, arrival_s, computed + 1, 1, 1, 0, computed, 1, arrival_s, arrival_s)


@pytest.mark.parametrize(("computed", "dominates"), [(9_000, False), (11_000, True)])
def test_queueing_dominates_when_the_demand_exceeds_the_prefill_rate(computed, dominates):
    """Two arrivals 1 s apart asking ``computed`` tokens against 10,000 tok/s."""
    load = load_figures([_record(0.0, 0), _record(1.0, computed)], 10_000.0, 4.0)
    assert load["queueing_dominates"] is dominates
    assert load["demand_tok_s"] == pytest.approx(computed)
    assert load["drain_s"] == pytest.approx(3.0)


def test_a_burst_at_time_zero_is_queueing_when_anything_is_computed():
    assert load_figures([_record(0.0, 10)], 1e6, 1.0)["queueing_dominates"]
    assert not load_figures([_record(0.0, 0)], 1e6, 1.0)["queueing_dominates"]


def test_admission_waits_longer_than_prefill_is_queueing_under_the_rate():
    """One request at a time, each decoding 100 tokens (2.5 s), one arriving every 0.1 s: the
    prefill demand is far under the rate but requests wait for admission ever longer."""
    trace = Trace(tuple(TraceRequest(100 * i, 512, 100, (i,)) for i in range(20)), B)
    run = replay(trace, ReplayConfig(max_running=1, **FAST))
    load = load_figures(run.records, run.cost.prefill_tps, run.modelled_s)
    assert not load["demand_over_rate"] and load["utilization"] < 0.5
    assert load["wait_p50_s"] > 10 * load["admitted_to_first_token_p50_s"]
    assert load["queueing_dominates"]


@pytest.mark.parametrize(("gap_ms", "dominates"), [(2000, False), (100, True)])
def test_the_report_flags_queue_bound_ttfts(tmp_path, capsys, gap_ms, dominates):
    """4,096-token prompts at 4,096 tok/s: one every 2 s keeps up, ten a second do not."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "out"
    _write(trace, _unique_prompts(8, gap_ms=gap_ms).requests)
    argv = ["replay", str(trace), "--prefill-tps", "4096", "--out-dir", str(out), *FAST_FLAGS]
    assert main(argv) == 0
    report = json.loads((out / "replay.json").read_text())
    assert report["queueing_dominates"] is dominates
    assert report["load"]["prefill_tps"] == 4096
    text = capsys.readouterr().out
    assert ("QUEUEING DOMINATES" in text) is dominates
    assert ("(queue-bound" in text) is dominates


def test_memory_figures_name_the_pools_and_the_tree():
    cfg = ReplayConfig(device_tokens=8192, host_ratio=4, **FAST)
    memory = replay(_unique_prompts(4), cfg).memory
    assert memory is not None
    device = cfg.token_bytes * (cfg.device_slots + cfg.page_size)  # the pool's padding page
    assert memory.device_kv == device and memory.host_kv == 4 * cfg.device_slots * cfg.token_bytes
    assert memory.tree >= 4 * 4096 * (4 + 8)  # every prompt cached: int32 keys, int64 slots
    assert memory.peak >= memory.start > 0
    assert memory.to_dict()["peak_over_held"] == pytest.approx(memory.peak / memory.held)


def test_a_sweep_measures_the_bandwidth_once(tmp_path, monkeypatch, capsys):
    calls = []
    measure = runner_module.measure_bandwidth
    monkeypatch.setattr(runner_module, "measure_bandwidth", lambda c: calls.append(c) or measure(c))
    trace, out = tmp_path / "t.jsonl", tmp_path / "out"
    _write(trace, _unique_prompts(3).requests)
    argv = ["replay", str(trace), "--sweep", "host-ratio=0,2,4", "--out-dir", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert len(calls) == 1 and len(runs) == 3
    assert runs[1]["cost_model"]["h2d_gb_s"] == runs[2]["cost_model"]["h2d_gb_s"] > 0
    assert "(measured), the same for every point" in capsys.readouterr().out

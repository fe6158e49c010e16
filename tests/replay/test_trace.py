"""Trace parsing: every line validated, bad lines named by number or skipped and counted."""

import json

import numpy as np
import pytest

from hicache.replay import TraceError, TraceRequest, prompt_tokens, read_trace, write_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _write(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_reads_sorted_by_timestamp_and_ignores_blank_lines(tmp_path):
    late = {**GOOD, "timestamp": 7.5, "hash_ids": [3, 4]}
    path = _write(tmp_path, [json.dumps(late), "", json.dumps(GOOD)])
    trace = read_trace(path)
    assert [r.timestamp_ms for r in trace.requests] == [0.0, 7.5]
    assert trace.requests[1].hash_ids == (3, 4) and trace.skipped == 0


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"input_length": 0}, "'input_length' must be >= 1"),
        ({"input_length": 2.0}, "'input_length' must be an int"),
        ({"output_length": -1}, "'output_length' must be >= 0"),
        ({"timestamp": -1}, "'timestamp' must be a finite number >= 0"),
        ({"timestamp": "now"}, "'timestamp' must be a number"),
        ({"hash_ids": [1]}, "= 2 ids, got 1"),
        ({"hash_ids": [1, -2]}, "'hash_ids' must be ints in"),
        ({"hash_ids": [1, True]}, "'hash_ids' must be ints in"),
        ({"hash_ids": "12"}, "'hash_ids' must be a list"),
    ],
)
def test_bad_line_names_its_number(tmp_path, change, words):
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, **change})])
    with pytest.raises(TraceError, match=f"t.jsonl:2: .*{words}"):
        read_trace(path)


def test_not_json_and_not_an_object(tmp_path):
    with pytest.raises(TraceError, match=":1: not JSON"):
        read_trace(_write(tmp_path, ["{oops"]))
    with pytest.raises(TraceError, match=":1: a line must be a JSON object"):
        read_trace(_write(tmp_path, ["[1, 2]"]))


def test_skip_bad_counts_and_keeps_the_first_message(tmp_path):
    lines = ["{oops", json.dumps(GOOD), json.dumps({**GOOD, "input_length": 0})]
    trace = read_trace(_write(tmp_path, lines), skip_bad=True)
    assert len(trace.requests) == 1 and trace.skipped == 2
    assert trace.first_error is not None and ":1: not JSON" in trace.first_error


def test_a_trace_without_any_valid_request_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no valid request"):
        read_trace(_write(tmp_path, ["{oops"]), skip_bad=True)


def test_block_size_sets_the_hash_count(tmp_path):
    path = _write(tmp_path, [json.dumps({**GOOD, "hash_ids": [1, 2, 3, 4, 5]})])
    assert read_trace(path, block_tokens=128).requests[0].hash_ids == (1, 2, 3, 4, 5)


def test_write_then_read_round_trips(tmp_path):
    reqs = [TraceRequest(1.0, 600, 3, (5, 6)), TraceRequest(2.5, 10, 0, (7,))]
    write_trace(tmp_path / "w.jsonl", reqs)
    assert read_trace(tmp_path / "w.jsonl").requests == tuple(reqs)


def test_tokens_equal_for_equal_hashes_and_differ_otherwise():
    a = prompt_tokens((4, 9), 700, 512)
    b = prompt_tokens((4, 9, 2), 1100, 512)
    c = prompt_tokens((5, 9), 700, 512)
    assert a.dtype == np.int32 and not a.flags.writeable and len(a) == 700
    assert np.array_equal(a, b[:700])
    assert not np.array_equal(a[:512], c[:512]) and np.array_equal(a[512:], c[512:])


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (json.dumps({**GOOD, "timestamp": 10**400}).encode(), "'timestamp' must be a finite"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (json.dumps(GOOD).encode()[:-1] + b', "x": "\xff\xfe"}', "not UTF-8"),
    ],
    ids=["int-past-float", "deep-nesting", "bad-utf8"],
)
def test_every_bad_line_is_named_and_skippable(tmp_path, line, words):
    path = tmp_path / "t.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + line + b"\n")
    with pytest.raises(TraceError, match=f"t.jsonl:2: .*{words}"):
        read_trace(path)
    trace = read_trace(path, skip_bad=True)
    assert len(trace.requests) == 1 and trace.skipped == 1

"""Where users switch KV events on: build_kv_stack, CacheSpec, the bench and replay commands."""

from __future__ import annotations

import pytest
import torch

from hicache import RadixKey, build_kv_stack
from hicache.__main__ import main
from hicache.engine import CacheSpec
from hicache.radix.events import AllBlocksCleared, BlockStored, EventQueue

GEOMETRY = {"layer_num": 1, "head_num": 1, "head_dim": 4, "dtype": torch.float32}
SIZES = {"size": 16, "max_requests": 2, "max_context_len": 16}


def test_build_kv_stack_sends_events_to_a_given_sink_and_leaves_it_open() -> None:
    sink = EventQueue()
    stack = build_kv_stack(**GEOMETRY, **SIZES, kv_events=sink)
    slots = stack.allocator.alloc(2)
    stack.cache.insert(RadixKey([5, 6]), slots)
    events = sink.take_events()
    assert isinstance(events[0], AllBlocksCleared)  # a new cache starts the stream over
    assert [e.medium for e in events[1:] if isinstance(e, BlockStored)] == ["GPU", "GPU"]
    assert stack.events is sink and not stack.owns_events
    stack.close()


def test_build_kv_stack_owns_the_publisher_it_builds() -> None:
    stack = build_kv_stack(**GEOMETRY, **SIZES, kv_events="tcp://127.0.0.1:*")
    assert stack.owns_events and stack.events.endpoint.startswith("tcp://127.0.0.1:")  # type: ignore[union-attr]
    stack.close()
    assert stack.events.dropped == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(("value", "error"), [(3, TypeError), ("127.0.0.1:5557", ValueError)])
def test_bad_kv_events_are_refused_before_anything_is_built(
    value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="kv_events|endpoint"):
        build_kv_stack(**GEOMETRY, **SIZES, kv_events=value)
    with pytest.raises(error, match="kv_events|endpoint"):
        CacheSpec(kv_events=value)


@pytest.mark.parametrize("command", [["bench"], ["replay", "missing.jsonl"]])
def test_a_replay_endpoint_needs_kv_events(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--kv-events-replay", "tcp://127.0.0.1:1"]) == 2
    assert "--kv-events-replay needs --kv-events" in capsys.readouterr().err

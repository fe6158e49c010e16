"""``hicache.devices``: the current stream as CUDA has it, on every call."""

from __future__ import annotations

import pytest
import torch

from hicache import devices

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_has_no_stream() -> None:
    assert devices.current_stream("cpu") is None
    assert devices.current_stream(torch.device("cpu")) is None


@cuda
def test_current_stream_follows_every_stream_change() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    first, second = torch.cuda.Stream(device=device), torch.cuda.Stream(device=device)
    outer = devices.current_stream(device)
    assert outer is not None and outer.cuda_stream == torch.cuda.current_stream().cuda_stream
    for _ in range(2):  # the second time from the kept objects
        with torch.cuda.stream(first):
            s = devices.current_stream(device)
            assert s is not None and s.cuda_stream == first.cuda_stream
            with torch.cuda.stream(second):
                s = devices.current_stream("cuda")
                assert s is not None and s.cuda_stream == second.cuda_stream
            s = devices.current_stream(device)
            assert s is not None and s.cuda_stream == first.cuda_stream
        s = devices.current_stream(device)
        assert s is not None and s.cuda_stream == outer.cuda_stream


def test_cpu_stream_scope_is_a_no_op() -> None:
    with devices.stream_scope(None):
        x = torch.ones(3) * 2
    assert x.tolist() == [2.0, 2.0, 2.0]


@cuda
def test_stream_scope_sets_and_restores_the_current_stream() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    outer = torch.cuda.current_stream().cuda_stream
    first, second = torch.cuda.Stream(device=device), torch.cuda.Stream(device=device)
    with devices.stream_scope(first):
        assert torch.cuda.current_stream().cuda_stream == first.cuda_stream
        with devices.stream_scope(second):
            assert torch.cuda.current_stream().cuda_stream == second.cuda_stream
        assert torch.cuda.current_stream().cuda_stream == first.cuda_stream
    assert torch.cuda.current_stream().cuda_stream == outer
    with pytest.raises(RuntimeError, match="inside"):
        with devices.stream_scope(first):
            raise RuntimeError("inside")
    assert torch.cuda.current_stream().cuda_stream == outer
    assert torch.cuda.current_device() == device.index


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_stream_scope_on_another_device_restores_both() -> None:
    torch.cuda.set_device(0)
    before = [torch.cuda.current_stream(d).cuda_stream for d in (0, 1)]
    other = torch.cuda.Stream(device=1)
    with devices.stream_scope(other):
        assert torch.cuda.current_device() == 1
        assert torch.cuda.current_stream(1).cuda_stream == other.cuda_stream
    assert torch.cuda.current_device() == 0
    assert [torch.cuda.current_stream(d).cuda_stream for d in (0, 1)] == before


def test_same_device_lets_an_index_left_out_match_any() -> None:
    cuda, cuda0, cuda1 = torch.device("cuda"), torch.device("cuda", 0), torch.device("cuda", 1)
    same_device = devices.same_device
    assert same_device(cuda, cuda0) and same_device(cuda1, cuda) and same_device(cuda0, cuda0)
    assert not same_device(cuda0, cuda1) and not same_device(torch.device("cpu"), cuda)

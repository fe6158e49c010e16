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

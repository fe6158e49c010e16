"""CPU/CUDA differences in one place: streams, events, pinning.

On CPU every transfer is synchronous, so streams are ``None``, events are already complete and
stream scopes are no-ops. On CUDA these are the real ``torch.cuda`` objects. Nothing here imports
from the rest of the package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class EventLike(Protocol):
    def record(self, stream: Any = None) -> None: ...
    def wait(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...


class CompletedEvent:
    """Stand-in for ``torch.cuda.Event`` on CPU: work is synchronous, so it is always done."""

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def canonical_device(device: torch.device | str) -> torch.device:
    """``device`` with its index made explicit: ``"cuda"`` becomes ``cuda:<current>``.

    Pools store this form so that ``tensor.device == pool.device`` compares like with like.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def new_event(device: torch.device | str) -> EventLike:
    """A fresh event: a CUDA event on CUDA, a completed no-op event on CPU."""
    return torch.cuda.Event() if is_cuda(device) else CompletedEvent()


def new_stream(device: torch.device | str) -> torch.cuda.Stream | None:
    """A dedicated transfer stream on CUDA; ``None`` (synchronous) on CPU."""
    return torch.cuda.Stream(device=torch.device(device)) if is_cuda(device) else None


def current_stream(device: torch.device | str) -> torch.cuda.Stream | None:
    """The compute stream: CUDA's current stream, or ``None`` on CPU."""
    return torch.cuda.current_stream(torch.device(device)) if is_cuda(device) else None


@contextlib.contextmanager
def stream_scope(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Run the body on ``stream``; a no-op when ``stream`` is ``None``."""
    if stream is None:
        yield
    else:
        with torch.cuda.stream(stream):
            yield


def pin_tensor(tensor: torch.Tensor) -> bool:
    """Page-lock an existing CPU tensor in place with ``cudaHostRegister``.

    Unlike ``pin_memory=True`` this does not round the allocation up to a power of two.
    Returns True when registered; raise ``RuntimeError`` when CUDA refuses.
    """
    if not torch.cuda.is_available() or tensor.numel() == 0:
        return False
    nbytes = tensor.numel() * tensor.element_size()
    err = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with error {int(err)}")
    return True


def unpin_tensor(tensor: torch.Tensor) -> None:
    """Undo :func:`pin_tensor` (``cudaHostUnregister``)."""
    err = torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())
    if int(err) != 0:
        raise RuntimeError(f"cudaHostUnregister failed with error {int(err)}")

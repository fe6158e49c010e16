"""CPU/CUDA differences in one place: streams, events, pinning, slot tensors' host copies.

On CPU every transfer is synchronous, so streams are ``None``, events are already complete and
stream scopes are no-ops. On CUDA these are the real ``torch.cuda`` objects. Nothing here imports
from the rest of the package.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
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


COMPLETED = CompletedEvent()  # stateless: one can stand for many (a CPU write batch's)


def canonical_device(device: torch.device | str, name: str = "device") -> torch.device:
    """``device`` checked and with its index made explicit: ``"cuda"`` becomes
    ``cuda:<current>``, ``"cpu:0"`` plain ``cpu``.

    Pools store this form so that ``tensor.device == pool.device`` compares like with like.
    Raises ``TypeError`` unless ``device`` is a str or ``torch.device``, and ``ValueError``
    (naming the argument ``name``) for an unknown device string, a device type other than CPU
    or CUDA, or a CUDA device this machine does not have (no CUDA at all, or too few GPUs).
    """
    if isinstance(device, torch.device) and device.type == "cpu" and device.index is None:
        return device  # already canonical (every transfer batch passes its pool's device)
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be a str or torch.device, got {type(device).__name__}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name}={device!r} is not a device (e.g. 'cpu', 'cuda:0')") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"{name} must be 'cpu' or a CUDA device, got {str(device)!r}")
    return torch.device("cuda", _cuda_index(device, name))


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name one device, an index left out (SGLang's ``"cuda"``) matching
    any index of its type (the current device, where tensors are made)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _cuda_index(device: torch.device, name: str) -> int:
    if not torch.cuda.is_available():
        raise ValueError(
            f"{name}={str(device)!r} but CUDA is not available on this machine; use device='cpu'"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"{name}={str(device)!r} but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
    return index


def is_cuda(device: torch.device | str) -> bool:
    if isinstance(device, torch.device):  # no new device object (on every transfer call)
        return device.type == "cuda"
    return torch.device(device).type == "cuda"


def new_event(device: torch.device | str, timing: bool = False) -> EventLike:
    """A fresh event: a CUDA event on CUDA (``timing``: one ``elapsed_time`` can read, as the
    transfer counters do of a batch's start and finish events), a completed no-op event on
    CPU."""
    cuda = device.type == "cuda" if isinstance(device, torch.device) else is_cuda(device)
    return torch.cuda.Event(enable_timing=timing) if cuda else CompletedEvent()


def new_stream(device: torch.device | str, urgent: bool = False) -> torch.cuda.Stream | None:
    """A dedicated transfer stream on CUDA; ``None`` (synchronous) on CPU.

    ``urgent``: the device's highest stream priority (default priority otherwise, the lowest,
    which is also the compute stream's): the GPU then starts the stream's kernels on the next
    free SM before more blocks of kernels from lower-priority streams, so a small copy kernel
    is not held back behind a large matmul.
    """
    if not is_cuda(device):
        return None
    # a static method, typed as an instance one in the stubs
    priority = torch.cuda.Stream.priority_range()[1] if urgent else 0  # type: ignore[call-arg]
    return torch.cuda.Stream(device=torch.device(device), priority=priority)


_STREAMS: dict[int, torch.cuda.Stream] = {}  # raw handle -> a Stream object of that stream
_STREAMS_KEPT = 64  # more handles than torch's stream pools hand out: then start again


@functools.cache
def _raw_stream_reader() -> Callable[[int], int]:
    from triton.runtime import driver  # its CUDA driver loads on first use: CUDA calls only

    reader: Callable[[int], int] = driver.active.get_current_stream
    return reader


def raw_stream(index: int) -> int:
    """The raw handle of CUDA device ``index``'s current stream (what Triton's own launches
    read: torch's current stream, without building a ``torch.cuda.Stream``; ~0.2 us)."""
    return _raw_stream_reader()(index)


def current_stream(device: torch.device | str) -> torch.cuda.Stream | None:
    """The compute stream: CUDA's current stream, or ``None`` on CPU.

    ``torch.cuda.current_stream`` builds a new Python object on every call (~4 us on the H200
    host, several times per layer of a load batch): the object is kept per raw stream handle,
    read from the runtime on every call, so it is always the stream current now.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    raw = raw_stream(index)
    stream = _STREAMS.get(raw)
    if stream is None or stream.device_index != index:
        stream = torch.cuda.current_stream(index)
        if len(_STREAMS) >= _STREAMS_KEPT:
            _STREAMS.clear()
        _STREAMS[raw] = stream
    return stream


_NO_SCOPE = contextlib.nullcontext()  # reusable: entering it does nothing


def stream_scope(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[None]:
    """Run the body on ``stream``; a no-op when ``stream`` is ``None`` (a shared null context,
    no generator per call).

    What ``torch.cuda.stream(stream)`` does (``stream`` current on its device for the body,
    then each device's previous stream, and the previous device, current again), without its
    two ``torch.cuda.current_stream`` objects per entry: a load batch enters one per layer.
    """
    return _NO_SCOPE if stream is None else _on_stream(stream)


@contextlib.contextmanager
def _on_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    index = torch.cuda.current_device()
    here = current_stream(torch.device("cuda", index))
    there = here if stream.device_index == index else current_stream(stream.device)
    torch.cuda.set_stream(stream)  # also makes stream's device current
    try:
        yield
    finally:
        if there is not here:
            torch.cuda.set_stream(there)  # type: ignore[arg-type]
        torch.cuda.set_stream(here)  # type: ignore[arg-type]


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


HOST_COPY = "hicache_host_copy"  # the attribute by which a device slot tensor carries its host copy


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """CPU ``host`` on ``device``: ``host`` itself on the CPU; else one non-blocking copy from
    pinned memory (no wait for the device), returned carrying ``host`` (see :func:`host_copy`).
    ``host`` must not be written to afterwards (it is the device tensor's host metadata)."""
    if device.type == "cpu":
        return host
    pinned = host.pin_memory() if device.type == "cuda" else host
    out = pinned.to(device, non_blocking=True)
    setattr(out, HOST_COPY, host)
    return out


def known_host_copy(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor``'s values on the CPU when known without asking the device (the tensor itself
    on the CPU, the copy a :func:`to_device` or :func:`cat_slots` result carries), else None."""
    return tensor if tensor.device.type == "cpu" else getattr(tensor, HOST_COPY, None)


def cat_slots(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` (1-D, one device), carrying the concatenation of their host copies
    where each has a known one (:func:`known_host_copy`)."""
    out = torch.cat(tensors)
    if out.device.type == "cpu":
        return out
    hosts = [known_host_copy(t) for t in tensors]
    if all(h is not None for h in hosts):
        setattr(out, HOST_COPY, torch.cat(hosts))  # type: ignore[arg-type]
    return out


def slice_slots(tensor: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``tensor[start:end]`` (1-D), carrying the same slice of its known host copy."""
    out = tensor[start:end]
    host = known_host_copy(tensor)
    if out.device.type != "cpu" and host is not None:
        setattr(out, HOST_COPY, host[start:end])
    return out


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values on the CPU without asking the device where that can be done: the
    tensor itself on the CPU, the host copy a :func:`to_device` result carries, else a copy
    back (a device-to-host sync: it waits for the work queued before it). The carried copy is
    trusted: tensors hicache hands out are read-only for their users. Read the result, never
    write it."""
    if tensor.device.type == "cpu":
        return tensor
    known: torch.Tensor | None = getattr(tensor, HOST_COPY, None)  # ``known_host_copy``
    return tensor.to("cpu") if known is None else known

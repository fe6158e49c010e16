"""Host pool layouts, the io_backends each one supports, and host pool sizing.

Per part (K, V, or the MLA latent), with ``L`` layers, ``H`` heads of ``D`` elements:

=================== ==================================
layer_first         ``(L, size, H, D)``
page_first          ``(size, L, H, D)``
page_first_direct   ``(pages, L, page_size, H, D)``
page_head           ``(pages, H, page_size, L, D)``
=================== ==================================
"""

from __future__ import annotations

import math

import psutil

from hicache import env
from hicache.checks import check_choice, check_int
from hicache.env import ENV

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
IO_BACKENDS = ("auto", "kernel", "direct")
SUPPORTED_PAIRS = {
    "kernel": ("layer_first", "page_first", "page_head"),
    "direct": ("layer_first", "page_first_direct"),
    "auto": LAYOUTS,  # per batch, one of the two above (hicache.pools.auto_backend)
}
# (attention kind, io_backend, layout): every route the host pools support (page_head: MHA only).
# "auto" is listed where it can choose (layer_first); elsewhere it is the one backend listed.
ROUTES = tuple(
    (kind, backend, layout)
    for kind in ("mha", "mla")
    for backend, layouts in SUPPORTED_PAIRS.items()
    for layout in layouts
    if not (kind == "mla" and layout == "page_head")
    and (backend != "auto" or layout == "layer_first")
)
_GB = 1e9


def check_io_backend(io_backend: object) -> str:
    """``io_backend`` if it is one of :data:`IO_BACKENDS`, else ``ValueError``."""
    return check_choice("io_backend", io_backend, IO_BACKENDS)


def check_layout(layout: object, allowed: tuple[str, ...] = LAYOUTS, name: str = "layout") -> str:
    """``layout`` if it is one of ``allowed``, else ``ValueError`` naming ``name``."""
    return check_choice(name, layout, allowed)


def check_pair(layout: object, io_backend: object, name: str = "layout") -> None:
    """``ValueError`` unless ``io_backend`` and ``layout`` (the argument ``name``) are known and
    ``io_backend`` has an op for ``layout``: the one check of a (layout, io_backend) pair."""
    backend = check_io_backend(io_backend)
    check_layout(layout, name=name)
    if layout not in SUPPORTED_PAIRS[backend]:
        raise ValueError(
            f"{name}={layout!r} is not supported by io_backend={backend!r}; "
            f"it supports {SUPPORTED_PAIRS[backend]}"
        )


def part_shape(
    layout: str, size: int, page_size: int, layers: int, heads: int, dim: int
) -> tuple[int, ...]:
    """Shape of one part (K, V or latent) of a host buffer of ``size`` slots in ``layout``."""
    pages = size // page_size
    return {
        "layer_first": (layers, size, heads, dim),
        "page_first": (size, layers, heads, dim),
        "page_first_direct": (pages, layers, page_size, heads, dim),
        "page_head": (pages, heads, page_size, layers, dim),
    }[layout]


def host_slots(
    device_size: int,
    host_to_device_ratio: float,
    host_size_gb: float,
    page_size: int,
    bytes_per_slot: int,
    exact: int | None = None,
) -> int:
    """Host slots: from ``host_size_gb`` (GB = 1e9 bytes) when > 0, else ``ratio * device_size``;
    rounded up to whole pages and required to be at least one page (``ValueError`` otherwise).
    Any size above that works, smaller than the device pool too. ``exact`` (``slots``, a
    positive multiple of ``page_size``; ``ValueError`` otherwise) replaces both when given.
    """
    if exact is not None:
        if check_int("slots", exact, minimum=1) % page_size:
            raise ValueError(f"slots must be a multiple of page_size={page_size}, got {exact}")
        return exact
    for name, value in (
        ("host_to_device_ratio", host_to_device_ratio),
        ("host_size_gb", host_size_gb),
    ):
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not (number and value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite, non-negative number, got {value!r}")
    if host_size_gb > 0:
        slots = int(host_size_gb * _GB // bytes_per_slot)
    else:
        slots = int(device_size * host_to_device_ratio)
    slots = math.ceil(slots / page_size) * page_size
    if slots <= 0:
        raise ValueError(
            f"the host pool (0 slots from host_to_device_ratio={host_to_device_ratio}, "
            f"host_size_gb={host_size_gb}) must hold at least one page ({page_size} slots): "
            "raise host_to_device_ratio or host_size_gb"
        )
    return slots


def check_ram(nbytes: int) -> None:
    """``ValueError`` when ``nbytes`` exceeds available RAM minus ``ENV.host_ram_reserve_gb``."""
    reserve_gb = env.require(ENV.host_ram_reserve_gb)
    usable = psutil.virtual_memory().available - reserve_gb * _GB
    if nbytes > usable:
        raise ValueError(
            f"the host pool needs {nbytes / _GB:.2f} GB but only {max(usable, 0) / _GB:.2f} GB of "
            f"RAM is available after keeping HICACHE_HOST_RAM_RESERVE_GB="
            f"{reserve_gb:g} GB free: lower host_size_gb or host_to_device_ratio"
        )

"""MatchResult: what ``match_prefix`` found, with its slot indices joined only when read.

SGLang 0.5.23's ``match_prefix`` returns a length (``device_prefix_len``) and nodes, and reads
the slot indices off the locked path later; earlier SGLang (and hicache) returned them joined,
``device_indices``. A ``MatchResult`` has both: ``device_prefix_len`` is set by the match and
``device_indices`` is joined on its first read (then kept), so a caller that reads only the
length, the nodes or the host hit does not pay for the join (about 25-45 us for 128k tokens of
CPU slots; an allocation and a copy kernel on CUDA). A lazy property rather than an option of
``match_prefix``: every caller keeps SGLang's call and field, and none pays for what it does
not read.

The tree may change between the match and the read (a split, an insert, an eviction, a
load-back): the result keeps the slot arrays the matched nodes held at match time (references,
no copy), and the tree never writes a stored slot array in place (a split gives the upper half a
copy and the lower half a view, and every other change binds a new array or drops the old one).
So ``device_indices`` is, whenever it is read, what a join at match time would have given; as
then, those slots hold the prefix's KV only while ``last_device_node`` is locked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from hicache.radix.node import TreeNode
from hicache.radix.slots import SlotsToJoin


class MatchResult:
    """Result of ``match_prefix``.

    device_indices : int64 ``[device_prefix_len]`` device KV slots of the longest cached
        page-aligned prefix that is on the device (empty on a miss); a fresh tensor the caller
        may keep, joined on the first read and the same tensor on every later read.
    device_prefix_len : tokens of that prefix (SGLang 0.5.23's name), without joining anything.
    last_device_node : deepest matched node holding a device copy (the root on a miss); lock it
        (``inc_lock_ref``) before using ``device_indices``.
    last_host_node : deepest matched node, device or host-only; equals ``last_device_node`` in a
        cache without a host tier.
    host_hit_length : tokens matched past ``last_device_node`` that exist only on the host (0
        without a host tier).

    ``device_indices`` may be given joined (a tensor) or as ``slots.SlotsToJoin`` (what
    ``match_prefix`` gives). Unpacking (``indices, last, host, n = result``) gives the four
    fields in that order, as the former NamedTuple did.
    """

    __slots__ = (
        "_indices",
        "device_prefix_len",
        "last_device_node",
        "last_host_node",
        "host_hit_length",
    )

    def __init__(
        self,
        device_indices: torch.Tensor | SlotsToJoin,
        last_device_node: TreeNode,
        last_host_node: TreeNode,
        host_hit_length: int = 0,
    ) -> None:
        if not isinstance(device_indices, torch.Tensor | SlotsToJoin):
            raise TypeError(
                "device_indices must be a torch.Tensor or a SlotsToJoin, got "
                f"{type(device_indices).__name__}"
            )
        self._indices = device_indices
        if isinstance(device_indices, SlotsToJoin):
            self.device_prefix_len = device_indices.length
        else:
            self.device_prefix_len = len(device_indices)
        self.last_device_node, self.last_host_node = last_device_node, last_host_node
        self.host_hit_length = host_hit_length

    @property
    def device_indices(self) -> torch.Tensor:
        indices = self._indices
        if isinstance(indices, SlotsToJoin):
            # joined once; dropping the SlotsToJoin unpins the tree's arrays
            indices = self._indices = indices.join()
        return indices

    def __iter__(self) -> Iterator[Any]:
        yield from (
            self.device_indices,
            self.last_device_node,
            self.last_host_node,
            self.host_hit_length,
        )

    def __repr__(self) -> str:
        return (
            f"MatchResult(device_prefix_len={self.device_prefix_len}, "
            f"last_device_node={self.last_device_node!r}, "
            f"last_host_node={self.last_host_node!r}, host_hit_length={self.host_hit_length})"
        )


def match_over(path: list[TreeNode], root: TreeNode, device: torch.device) -> MatchResult:
    """The result of a match that walked ``path`` (the matched nodes, root side first) in the
    tree of ``root``, whose device slots live on ``device``; the slots are joined when read."""
    parts, last_device, device_len, host_len = [], root, 0, 0
    for node in path:
        slots = node.slots
        if slots is None:
            host_len += len(node.key)
        else:
            parts.append(slots)
            device_len += len(slots)
            last_device = node
    last_host = path[-1] if path else root
    indices = SlotsToJoin(parts, device, device_len)
    return MatchResult(indices, last_device, last_host, host_len)

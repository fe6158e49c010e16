"""The match rule of a hybrid model's cache, and the result that names what to restore from.

A prefix of ``p`` tokens is usable when (1) its full-attention KV covers every token, (2) its
sliding-window KV covers the last ``min(W, p)`` tokens (no tombstoned node among them), and
(3), for a model with linear layers, it ends at a node holding a recurrent state. The empty
prefix is always usable (a cold start). ``match_prefix`` returns the longest usable prefix
(``device_prefix_len``, ``last_device_node``) and, beside it, the longest full-KV prefix
(``full_kv_hit_length``, SGLang's name) for a scheduler that prefers recomputing the tail.

With a host tier the rule also runs over the host-only nodes below the device ones, each judged
by its host copy (``host_state``, ``host_swa_gone``): ``last_host_node`` is the end of the
longest prefix usable after a load-back, and ``host_hit_length`` its tokens past the usable
device prefix (device nodes between the two included: the load-back returns their slots too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache.radix.components import (
    HybridConfig,
    host_state_of,
    host_swa_gone,
    is_tombstoned,
    state_of,
)
from hicache.radix.match import MatchResult
from hicache.radix.node import TreeNode
from hicache.radix.slots import SlotsToJoin


class HybridMatchResult(MatchResult):
    """A ``MatchResult`` (the usable prefix) with what a hybrid model restores from.

    Attributes
    ----------
    state_slot : the ``MambaPool`` slot of the state after the usable prefix (restore it into
        the request's state slot, ``restore_states``), or None (no linear layers, or a miss).
    swa_window_start : the first token whose SWA KV the request reads:
        ``max(0, device_prefix_len - W)`` (0 without sliding-window layers).
    full_kv_hit_length : tokens of the longest prefix with full KV alone (>= the usable one).
    full_kv_node : its last node (the root on a miss); lock it to use that longer prefix.
    mamba_branching_seqlen : under ``CheckpointPolicy.at_branch``, ``full_kv_hit_length`` when
        it passes the usable prefix (a chunk ending there can be checkpointed); else None.
    """

    __slots__ = (
        "state_slot",
        "swa_window_start",
        "full_kv_hit_length",
        "full_kv_node",
        "mamba_branching_seqlen",
    )

    def __init__(
        self,
        usable: tuple[SlotsToJoin, TreeNode],
        state_slot: int | None,
        swa_window_start: int,
        full: tuple[int, TreeNode],
        branching: int | None,
        host: tuple[TreeNode, int] | None = None,
    ) -> None:
        last_host, host_len = (usable[1], 0) if host is None else host
        super().__init__(usable[0], usable[1], last_host, host_len)
        self.state_slot, self.swa_window_start = state_slot, swa_window_start
        self.full_kv_hit_length, self.full_kv_node = full
        self.mamba_branching_seqlen = branching

    @property
    def state_evicted(self) -> bool:
        """A longer full-KV match exists whose state (or window) is gone: usable only by
        recomputing from the usable prefix, or by a model without linear layers."""
        return self.full_kv_hit_length > self.device_prefix_len

    def __repr__(self) -> str:
        return (
            f"HybridMatchResult(device_prefix_len={self.device_prefix_len}, "
            f"state_slot={self.state_slot}, swa_window_start={self.swa_window_start}, "
            f"full_kv_hit_length={self.full_kv_hit_length}, "
            f"host_hit_length={self.host_hit_length})"
        )


def _device_gone(node: TreeNode) -> bool:
    return is_tombstoned(node.comp)


def _device_state(node: TreeNode) -> int | None:
    return state_of(node.comp)


def _any_gone(node: TreeNode) -> bool:
    """The SWA KV of ``node``'s copy a match would use: the device one, else the host one."""
    return is_tombstoned(node.comp) if node.slots is not None else host_swa_gone(node.comp)


def _any_state(node: TreeNode) -> int | None:
    return state_of(node.comp) if node.slots is not None else host_state_of(node.comp)


def window_intact(
    path: list[TreeNode],
    end: int,
    window: int | None,
    gone: Callable[[TreeNode], bool] = _device_gone,
) -> bool:
    """Whether the nodes ``path[:end + 1]`` (root side first) hold SWA KV for the last
    ``window`` tokens they cover (always, for ``window`` None); ``gone`` tells a node
    without it (default: its device copy is tombstoned)."""
    if window is None:
        return True
    covered = 0
    for node in reversed(path[: end + 1]):
        if gone(node):
            return False
        covered += len(node.key)
        if covered >= window:
            return True
    return True


def usable_end(
    path: list[TreeNode],
    config: HybridConfig,
    state: Callable[[TreeNode], int | None] = _device_state,
    gone: Callable[[TreeNode], bool] = _device_gone,
) -> int:
    """The index in ``path`` of the deepest node ending a usable prefix; -1 for the root.
    ``state`` and ``gone`` read a node's state and SWA tombstone (default: its device copy's)."""
    for i in range(len(path) - 1, -1, -1):
        if config.recurrent and state(path[i]) is None:
            continue
        if window_intact(path, i, config.sliding_window, gone):
            return i
    return -1


def host_end(path: list[TreeNode], on_device: int, end: int, config: HybridConfig) -> int:
    """The index of the deepest node of ``path`` ending a prefix usable after loading its
    host-only nodes (``path[on_device:]``), or ``end`` (the device one) when none is deeper."""
    if len(path) == on_device:
        return end
    return max(end, usable_end(path, config, _any_state, _any_gone))


def hybrid_match(
    path: list[TreeNode], root: TreeNode, device: torch.device, config: HybridConfig
) -> HybridMatchResult:
    """The result of a match that walked ``path`` (root side first): device nodes, then
    host-only ones (a cache with a host tier)."""
    on_device = next((i for i, n in enumerate(path) if n.slots is None), len(path))
    end = usable_end(path[:on_device], config)
    deep = host_end(path, on_device, end, config)
    used = path[: end + 1]
    length = sum(len(node.key) for node in used)
    last = used[-1] if used else root
    usable = (SlotsToJoin([n.slots for n in used if n.slots is not None], device, length), last)
    window = config.sliding_window
    start = 0 if window is None else max(0, length - window)
    full_len = sum(len(node.key) for node in path[:on_device])
    branching = None
    if config.checkpoint.at_branch and config.recurrent and full_len > length:
        branching = full_len
    full = (full_len, path[on_device - 1] if on_device else root)
    host_len = sum(len(node.key) for node in path[end + 1 : deep + 1])
    host = (path[deep] if deep > end else last, host_len)
    return HybridMatchResult(usable, state_of(last.comp), start, full, branching, host)

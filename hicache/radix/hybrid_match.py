"""The match rule of a hybrid model's cache, and the result that names what to restore from.

A prefix of ``p`` tokens is usable when (1) its full-attention KV covers every token, (2) its
sliding-window KV covers the last ``min(W, p)`` tokens (no tombstoned node among them), and
(3), for a model with linear layers, it ends at a node holding a recurrent state. The empty
prefix is always usable (a cold start). ``match_prefix`` returns the longest usable prefix
(``device_prefix_len``, ``last_device_node``) and, beside it, the longest full-KV prefix
(``full_kv_hit_length``, SGLang's name) for a scheduler that prefers recomputing the tail.
"""

from __future__ import annotations

import torch

from hicache.radix.components import HybridConfig, is_tombstoned, state_of
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
    ) -> None:
        super().__init__(usable[0], usable[1], usable[1])
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
            f"full_kv_hit_length={self.full_kv_hit_length})"
        )


def window_intact(path: list[TreeNode], end: int, window: int | None) -> bool:
    """Whether the nodes ``path[:end + 1]`` (root side first) hold SWA KV for the last
    ``window`` tokens they cover (always, for ``window`` None)."""
    if window is None:
        return True
    covered = 0
    for node in reversed(path[: end + 1]):
        if is_tombstoned(node.comp):
            return False
        covered += len(node.key)
        if covered >= window:
            return True
    return True


def usable_end(path: list[TreeNode], config: HybridConfig) -> int:
    """The index in ``path`` of the deepest node ending a usable prefix; -1 for the root."""
    for i in range(len(path) - 1, -1, -1):
        if config.recurrent and state_of(path[i].comp) is None:
            continue
        if window_intact(path, i, config.sliding_window):
            return i
    return -1


def hybrid_match(
    path: list[TreeNode], root: TreeNode, device: torch.device, config: HybridConfig
) -> HybridMatchResult:
    """The result of a match that walked the device nodes ``path`` (root side first)."""
    end = usable_end(path, config)
    used = path[: end + 1]
    length = sum(len(node.key) for node in used)
    last = used[-1] if used else root
    usable = (SlotsToJoin([n.slots for n in used if n.slots is not None], device, length), last)
    window = config.sliding_window
    start = 0 if window is None else max(0, length - window)
    full_len = sum(len(node.key) for node in path)
    branching = None
    if config.checkpoint.at_branch and config.recurrent and full_len > length:
        branching = full_len
    full = (full_len, path[-1] if path else root)
    return HybridMatchResult(usable, state_of(last.comp), start, full, branching)

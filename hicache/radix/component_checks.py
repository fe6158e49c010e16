"""Invariant checks of a hybrid tree's components (``HybridRadixCache.check_invariants``).

States: exactly the nodes in the ``ComponentLedger``'s LRU hold one, each a distinct slot the
state pool has allocated, each at a node whose window is intact (a usable match end).
Tombstones: only with a sliding window, only on device nodes, their tokens summed in the
gauge; with an allocator that maps full slots to SWA slots, a live node's slots all map to an
SWA slot and a tombstoned node's to none. O(nodes + tokens): for tests and debugging.
"""

from __future__ import annotations

from typing import Any, NoReturn

from hicache.radix.component_ledger import ComponentLedger
from hicache.radix.components import is_tombstoned, state_of
from hicache.radix.hybrid_match import window_intact
from hicache.radix.node import TreeNode
from hicache.radix.slots import as_tensor
from hicache.radix.tree import RadixTree


def _fail(message: str) -> NoReturn:
    raise RuntimeError(f"radix tree invariant violated: {message}")


def check_components(tree: RadixTree, ledger: ComponentLedger, allocator: Any) -> None:
    """``RuntimeError`` naming the first broken invariant of the components of ``tree``."""
    nodes = list(tree.nodes())
    _check_states(tree, ledger, [n for n in nodes if state_of(n.comp) is not None])
    _check_tombstones(ledger, nodes, allocator)


def _check_states(tree: RadixTree, ledger: ComponentLedger, holders: list[TreeNode]) -> None:
    if set(holders) != set(ledger.state_lru):
        _fail("the state LRU is not the set of nodes holding a state")
    if holders and not ledger.config.recurrent:
        _fail("a node holds a state but the model has no linear layers")
    slots = [state_of(n.comp) for n in holders]
    if len(set(slots)) != len(slots):
        _fail(f"a state slot is held by two nodes: {sorted(slots)}")  # type: ignore[type-var]
    window = ledger.config.sliding_window
    for node in holders:
        if not ledger.state_pool.is_allocated(state_of(node.comp)):
            _fail(f"node {node.id}: state {state_of(node.comp)} is not allocated in the pool")
        path = tree.path_to_root(node)[::-1]
        if not window_intact(path, len(path) - 1, window):
            _fail(f"node {node.id} holds a state whose window has a tombstone (unusable)")


def _check_tombstones(ledger: ComponentLedger, nodes: list[TreeNode], allocator: Any) -> None:
    dead = [n for n in nodes if is_tombstoned(n.comp)]
    if dead and ledger.config.sliding_window is None:
        _fail("a node is tombstoned but the model has no sliding-window layers")
    if any(n.slots is None for n in dead):
        _fail("a tombstoned node has no full KV on the device")
    if sum(len(n.key) for n in dead) != ledger.swa_tombstoned_tokens:
        _fail(f"swa_tombstoned_tokens={ledger.swa_tombstoned_tokens} != the tombstoned tokens")
    translate = getattr(allocator, "translate_loc_from_full_to_swa", None)
    if translate is None:
        return
    for node in nodes:
        if node.slots is None:
            continue
        mapped = translate(as_tensor(node.slots).to(allocator.device)).cpu()
        dead_node = is_tombstoned(node.comp)
        if bool((mapped > 0).any()) if dead_node else bool((mapped <= 0).any()):
            state = "tombstoned node maps" if dead_node else "live node lacks"
            _fail(f"node {node.id}: a {state} an SWA slot")


__all__ = ["check_components"]

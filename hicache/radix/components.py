"""A hybrid model's components on a radix node, and the settings that say which it has.

A node of a plain model's tree holds one component, the full-attention KV slots
(``TreeNode.slots``). A hybrid model (``ModelConfig.layer_pattern`` with ``S`` or ``L`` layers)
needs two more to resume from a cached prefix (names as SGLang's ``ComponentType``):

- ``swa``: the sliding-window layers' KV of the node's tokens. Their slots are the full slots'
  images through the allocator's map (``SWATokenToKVPoolAllocator.full_to_swa_index_mapping``),
  so the node keeps only whether they are still there: a *tombstoned* node gave its SWA slots
  back (``free_swa``) and stays in the tree for its full KV.
- ``mamba``: at most one recurrent-state slot (a ``MambaPool`` slot holding a checkpoint of
  every linear layer's conv and temporal state after the node's last token).

With a host tier the node's host copy carries both too: ``host_state`` (a ``MambaPoolHost``
slot) and whether the host copy's SWA KV is valid (``host_swa_gone``: the node was already
tombstoned when it was backed up).

``NodeComponents`` is that value (``TreeNode.comp``; None means "SWA present, no state", so a
plain model's nodes carry nothing and its paths never look at it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from hicache.checks import check_int

FULL: Final = "full"
SWA: Final = "swa"
MAMBA: Final = "mamba"
COMPONENTS: Final = (FULL, SWA, MAMBA)


class NodeComponents:
    """The SWA and recurrent-state components of one node.

    Attributes
    ----------
    swa_tombstoned : the device copy's SWA KV was freed (every token of the node).
    state : the ``MambaPool`` slot of the state after the node's last token, or None.
    host_swa_gone : the host copy holds no valid SWA KV (backed up while tombstoned).
    host_state : the ``MambaPoolHost`` slot of the host copy of that state, or None.
    """

    __slots__ = ("swa_tombstoned", "state", "host_swa_gone", "host_state")

    def __init__(
        self,
        swa_tombstoned: bool = False,
        state: int | None = None,
        host_swa_gone: bool = False,
        host_state: int | None = None,
    ) -> None:
        self.swa_tombstoned, self.state = swa_tombstoned, state
        self.host_swa_gone, self.host_state = host_swa_gone, host_state

    def upper_half(self) -> NodeComponents | None:
        """The components of the upper node a split makes: the tombstones, never a state
        (it is the state after the lower node's last token)."""
        if self.swa_tombstoned or self.host_swa_gone:
            return NodeComponents(self.swa_tombstoned, host_swa_gone=self.host_swa_gone)
        return None

    def __repr__(self) -> str:
        return (
            f"NodeComponents(swa_tombstoned={self.swa_tombstoned}, state={self.state}, "
            f"host_swa_gone={self.host_swa_gone}, host_state={self.host_state})"
        )


def is_tombstoned(comp: NodeComponents | None) -> bool:
    return comp is not None and comp.swa_tombstoned


def state_of(comp: NodeComponents | None) -> int | None:
    return None if comp is None else comp.state


def host_swa_gone(comp: NodeComponents | None) -> bool:
    return comp is not None and comp.host_swa_gone


def host_state_of(comp: NodeComponents | None) -> int | None:
    return None if comp is None else comp.host_state


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a node gets a recurrent state (the request's state copied into a new slot).

    Attributes
    ----------
    at_finish : ``cache_finished_req`` checkpoints the request's end when it is page-aligned,
        else its last page boundary from the state the engine tracked there during decode
        (the request pool's extra buffer); ``cache_unfinished_req`` checkpoints the prompt's
        last page boundary (a scheduler ends a prefill chunk there: ``chunk_tokens``'s
        ``finish_at``).
    every_tokens : None, or N (a positive multiple of the page size): ``cache_unfinished_req``
        checkpoints a chunk end that passed a multiple of N since the request's last one, and
        a scheduler ends prefill chunks at multiples of N (``chunk_tokens``).
    at_branch : ``match_prefix`` reports ``mamba_branching_seqlen`` (the full-KV match's end,
        when past the state's), and ``cache_unfinished_req`` checkpoints a chunk that ends there.

    Trade-off: each state costs ``MambaStateParams.mamba_cache_per_req`` bytes. ``at_finish``
    alone keeps one per finished request, enough for multi-turn chat (the next turn extends
    the last); ``every_tokens`` adds ``len / N`` per long prompt and lets requests that share a
    document resume at a multiple of N; ``at_branch`` puts states exactly where prompts diverge
    at the price of one more prefill chunk boundary per request that branches.
    """

    at_finish: bool = True
    every_tokens: int | None = None
    at_branch: bool = False

    def chunk_tokens(
        self, done: int, limit: int, branch: int | None, finish_at: int | None = None
    ) -> int:
        """Tokens of a request's next prefill chunk, ``done`` tokens in: at most ``limit``,
        ending where this policy takes a state (``cache_unfinished_req`` checkpoints a chunk
        end): at ``branch`` (the match's ``mamba_branching_seqlen``) when it is ahead, at the
        next multiple of ``every_tokens``, and under ``at_finish`` at ``finish_at`` (the
        prompt's last page boundary, when the prompt does not end on one)."""
        n = limit
        for stop in (branch, finish_at if self.at_finish else None):
            if stop is not None and done < stop:
                n = min(n, stop - done)
        if self.every_tokens is not None:
            n = min(n, self.every_tokens - done % self.every_tokens)
        return n

    def __post_init__(self) -> None:
        for name in ("at_finish", "at_branch"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.every_tokens is not None:
            check_int("every_tokens", self.every_tokens, minimum=1)


@dataclass(frozen=True)
class HybridConfig:
    """The components a hybrid model's cache keeps beside full KV.

    Attributes
    ----------
    sliding_window : ``W`` of the model's sliding-window layers, or None (no ``S`` layer).
    recurrent : the model has linear-recurrent layers: a match must end at a node holding a
        state.
    checkpoint : the ``CheckpointPolicy`` (used only when ``recurrent``).
    """

    sliding_window: int | None = None
    recurrent: bool = False
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)

    def __post_init__(self) -> None:
        if self.sliding_window is not None:
            check_int("sliding_window", self.sliding_window, minimum=1)
        if not isinstance(self.recurrent, bool):
            raise TypeError(f"recurrent must be a bool, got {type(self.recurrent).__name__}")
        if not isinstance(self.checkpoint, CheckpointPolicy):
            raise TypeError(
                f"checkpoint must be a CheckpointPolicy, got {type(self.checkpoint).__name__}"
            )
        if self.sliding_window is None and not self.recurrent:
            raise ValueError("a hybrid cache needs sliding_window or recurrent (else: RadixCache)")

    def check_page_size(self, page_size: int) -> None:
        """``ValueError`` unless ``every_tokens`` is a multiple of ``page_size``."""
        every = self.checkpoint.every_tokens
        if every is not None and every % page_size:
            raise ValueError(f"every_tokens={every} must be a multiple of page_size={page_size}")

"""Overlapping conversations: the token streams a stress scenario sends through the cache.

Conversations belong to tenants (``extra_key`` None, "A" or "B") and start from one of two
system prompts that every tenant shares token for token, so prefixes overlap within a tenant
(real hits) and across tenants (hits that must never happen). Each turn appends a user message
and the model's answer to the history; a conversation that outgrows its context starts over.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

TENANTS: tuple[Hashable, ...] = (None, "A", "B")
SALTS = {tenant: i for i, tenant in enumerate(TENANTS)}  # the oracle's namespace salt
VOCAB = 50  # a small vocabulary makes unrelated prompts share first pages now and then


@dataclass
class Conversation:
    tenant: Hashable
    history: list[int] = field(default_factory=list)
    busy: bool = False  # a request of this conversation is in flight

    @property
    def salt(self) -> int:
        return SALTS[self.tenant]


@dataclass(frozen=True)
class Turn:
    """One request: ``prompt`` is sent; ``output`` is what the model will answer."""

    conversation: Conversation
    prompt: list[int]
    output: list[int]


class Workload:
    """Seeded source of turns over ``conversations`` conversations.

    Parameters
    ----------
    rng : shared with the scenario (one seed replays everything).
    unit : length unit in tokens; system prompts are 1-2 units, messages half to 1.5 units.
    max_context : a conversation whose next turn could exceed this starts over.
    """

    def __init__(
        self, rng: random.Random, unit: int, max_context: int, conversations: int = 8
    ) -> None:
        self.rng, self.unit, self.max_context = rng, unit, max_context
        self.systems = [self._tokens(rng.randint(unit, 2 * unit)) for _ in range(2)]
        self.conversations = [Conversation(TENANTS[i % len(TENANTS)]) for i in range(conversations)]
        for conv in self.conversations:
            self._restart(conv)

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def _restart(self, conv: Conversation) -> None:
        conv.history = list(self.rng.choice(self.systems))

    def next_turn(self) -> Turn | None:
        """A turn of a random idle conversation (now busy), or None when all are busy."""
        idle = [c for c in self.conversations if not c.busy]
        if not idle:
            return None
        conv = self.rng.choice(idle)
        message = self._tokens(self.rng.randint(self.unit // 2, 3 * self.unit // 2))
        output = self._tokens(self.rng.randint(1, max(1, self.unit // 2)))
        if len(conv.history) + len(message) + len(output) > self.max_context:
            self._restart(conv)
            message = message[: self.max_context - len(conv.history) - len(output)]
        conv.busy = True
        return Turn(conv, conv.history + message, output)

    def random_prefix(self) -> tuple[Hashable, list[int]]:
        """A tenant and a prefix of some conversation's history (for peeks and locks)."""
        conv = self.rng.choice(self.conversations)
        tenant = self.rng.choice(TENANTS) if self.rng.random() < 0.2 else conv.tenant
        return tenant, conv.history[: self.rng.randint(1, len(conv.history))]

    def finish(self, turn: Turn, completed: bool) -> None:
        """A completed turn becomes the history; an aborted one leaves it unchanged."""
        conv = turn.conversation
        if completed:
            conv.history = turn.prompt + turn.output
        conv.busy = False

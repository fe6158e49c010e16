"""Rank-local faults of the TP fuzz: the stress injector plus slow acks.

:class:`TPFaults` is the stress harness's :class:`~hicache.stress.faults.Faults` (whose
``flaky_storage`` makes a storage backend raise or miss) with one more injector: transfer acks
whose finish event reports not-done for a few polls (a transfer that lands later on this rank
than on the others). Each scenario installs only its own injectors, on the fault rank only
(``hicache.stress.tp_fuzz.scenarios``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hicache.controller import HiCacheAck
from hicache.stress.faults import Faults


class SlowEvent:
    """A transfer's finish event that reports not-done for its first ``polls`` queries.

    Parameters
    ----------
    event : the real finish event (``query()``, ``synchronize()``).
    polls : queries answered False before ``event`` is asked (a wait ends the delay).
    """

    def __init__(self, event: Any, polls: int) -> None:
        self.event, self.polls = event, polls

    def query(self) -> bool:
        if self.polls > 0:
            self.polls -= 1
            return False
        return bool(self.event.query())

    def synchronize(self) -> None:
        self.polls = 0
        self.event.synchronize()

    def __getattr__(self, name: str) -> Any:  # record/wait/elapsed_time: the real event's
        return getattr(self.event, name)


@dataclass
class TPFaults(Faults):
    """:class:`Faults` plus slow acks (see the module docstring).

    Parameters
    ----------
    p_slow : probability that a write or load batch's ack is slowed.
    slow_polls : the most polls a slowed ack reports not-done (at least one).
    """

    p_slow: float = 0.0
    slow_polls: int = 4

    def slow_acks(self, controller: Any) -> None:
        """Acks of batches issued by ``controller.start_writing`` / ``start_loading`` finish
        up to ``slow_polls`` polls late (with probability ``p_slow`` each)."""
        for name, queue in (
            ("start_writing", controller.ack_write_queue),
            ("start_loading", controller.ack_load_queue),
        ):
            self._patch(controller, name, self._slowed(getattr(controller, name), queue))

    def _slowed(self, issue: Callable[[], Any], queue: list[Any]) -> Callable[[], Any]:
        def wrapper() -> Any:
            before = len(queue)
            out = issue()
            if len(queue) > before and self._fire("slow_ack", self.p_slow):
                ack, polls = queue[-1], self.rng.randint(1, max(self.slow_polls, 1))
                slow = SlowEvent(ack.finish_event, polls)
                queue[-1] = HiCacheAck(ack.start_event, slow, ack.node_ids)
            return out

        return wrapper

"""The multi-turn chat workload and the loop that drives it through an engine in real time."""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from hicache.bench.config import BenchConfig
from hicache.engine import Engine, Request, Status
from hicache.engine.agreed import slowest
from hicache.tp import TPGroup


@dataclass(frozen=True)
class Record:
    """What one finished (or rejected) request measured."""

    user: int
    round: int
    prompt_tokens: int
    device_hit: int
    host_hit: int
    computed: int
    output_tokens: int
    ttft_s: float | None
    error: str | None
    storage_hit: int = 0


class ChatWorkload:
    """``users`` conversations sharing one system prompt, ``rounds`` turns each.

    Turn ``r`` of user ``u`` sends the whole history (system prompt, earlier turns and the
    model's answers) plus ``prompt_len`` new tokens and asks for ``answer_len`` tokens. All
    token ids are a pure function of ``seed``; the answers are whatever the model generates.
    """

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        rng = random.Random(cfg.seed)
        self.system = [rng.randrange(cfg.vocab) for _ in range(cfg.system_len)]
        self.turns = [
            [[rng.randrange(cfg.vocab) for _ in range(cfg.prompt_len)] for _ in range(cfg.rounds)]
            for _ in range(cfg.users)
        ]

    def first_arrivals(self, t0: float) -> list[tuple[float, int, int]]:
        """``(time, user, round=0)`` of every user's first turn: ``arrival_rate`` per second,
        spaced by ``1/arrival_rate`` (uniform) or exponential gaps of that mean (poisson,
        seeded by ``seed``); all at ``t0`` when the rate is 0."""
        rate, users = self.cfg.arrival_rate, self.cfg.users
        if rate == 0:
            return [(t0, u, 0) for u in range(users)]
        if self.cfg.arrival_distribution == "uniform":
            return [(t0 + u / rate, u, 0) for u in range(users)]
        rng = random.Random(self.cfg.seed + 1)
        times = list(itertools.accumulate(rng.expovariate(rate) for _ in range(users - 1)))
        return [(t0 + t, u, 0) for u, t in enumerate([0.0, *times])]


class Clock:
    """Seconds since it was made; under TP each reading is the largest over the ranks, so every
    rank sees the same arrivals due (every rank must read it at the same points). Under TP the
    ranks start it together: making it is a collective."""

    def __init__(self, tp: TPGroup) -> None:
        slowest(tp, 0.0, where="bench clock start")
        self.tp, self.t0 = tp, time.perf_counter()

    def local(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self) -> float:
        return slowest(self.tp, self.local(), where="bench clock")


def drive(
    engine: Engine,
    workload: ChatWorkload,
    on_record: Callable[[Record], None] | None = None,
    cache_salt: str | None = None,
    on_step: Callable[[], None] | None = None,
) -> tuple[list[Record], float]:
    """Run the whole workload through ``engine``, calling ``on_step`` after each of its steps;
    returns the records and the wall time (s).

    A user's next turn arrives the moment its previous answer is complete (closed loop); a
    rejected turn ends that user's conversation. Every request carries ``cache_salt``. Under TP
    (``engine.tp``) arrival times are the slowest rank's (``Clock``), so every rank submits the
    same requests at the same steps.
    """
    clock = Clock(engine.tp)
    arrivals = workload.first_arrivals(0.0)  # seconds since clock.t0
    heapq.heapify(arrivals)
    history = [list(workload.system) for _ in range(workload.cfg.users)]
    inflight: dict[Request, tuple[int, int]] = {}
    records: list[Record] = []
    while arrivals or engine.has_work():
        now = clock()
        while arrivals and arrivals[0][0] <= now:
            t, user, rnd = heapq.heappop(arrivals)
            history[user] += workload.turns[user][rnd]
            answer = workload.cfg.answer_len
            arrival = clock.t0 + t
            req = engine.submit(history[user], answer, arrival=arrival, cache_salt=cache_salt)
            inflight[req] = (user, rnd)
        if not engine.has_work():
            time.sleep(max(0.0, arrivals[0][0] - clock.local()))
            continue
        finished = engine.step()
        if on_step is not None:
            on_step()
        done_at = clock() if finished else now
        for req in finished:
            user, rnd = inflight.pop(req)
            records.append(_record(req, user, rnd))
            if on_record is not None:
                on_record(records[-1])
            if req.status is Status.FINISHED and rnd + 1 < workload.cfg.rounds:
                history[user] = req.origin_input_ids + req.output_ids
                heapq.heappush(arrivals, (done_at, user, rnd + 1))
    return records, clock.local()


def _record(req: Request, user: int, rnd: int) -> Record:
    return Record(
        user=user,
        round=rnd,
        prompt_tokens=len(req.origin_input_ids),
        device_hit=req.device_hit,
        host_hit=req.host_hit,
        storage_hit=req.storage_hit,
        computed=req.computed,
        output_tokens=len(req.output_ids),
        ttft_s=req.ttft,
        error=req.error,
    )

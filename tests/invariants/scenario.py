"""The seeded scenario generator: which modes, which workers, which calls when, which faults.

A scenario is a plan, a pure function of its seed (and of the knobs passed to
:func:`generate`); running it (:mod:`.runner`) is not deterministic (real processes), but
the same seed makes the same calls and injects the same faults at the same offsets.

What makes a scenario hard on the modes:

- **busy workers**: one or two workers with one to three pool processes each, prefetching
  up to four messages, and calls arriving in bursts faster than bodies of 0.1-1.2 s finish,
  so messages wait in prefetch and in the queue;
- **countdowns and ETAs** on about a quarter of the calls;
- **duplicate deliveries**: some calls' messages are published twice (same task id, same
  headers), and ``acks_late`` + ``reject_on_worker_lost`` redeliver what a killed pool
  process was running;
- **faults**: SIGKILL of a pool process running a body (``child_kill``) or of a whole worker,
  started again (``worker_kill``; ``parked_kill`` waits until a call is parked first, in
  every scenario with a mode whose calls a limit or a rate holds back); SIGSTOP of the
  lock Redis for 0.5-3.5 s, then SIGCONT (``redis_stall``, shorter than the lease: no
  lock may be lost); and, in scenarios of the restart class only, the lock Redis restarted
  empty on its port (``redis_restart``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.invariants.modes import MODES
from tests.invariants.records import WorkerInfo

__all__ = ["FAULT_KINDS", "PlannedCall", "PlannedFault", "Scenario", "generate"]

#: Fault kinds, in the order the figures list them.
FAULT_KINDS = (
    "child_kill",
    "worker_kill",
    "parked_kill",
    "redis_stall",
    "redis_restart",
    "duplicate_publish",
)
#: The lease of every task (seconds): longer than any stall, so no stall may cost a lock.
LEASE = 8.0
#: The broker's visibility timeout (seconds): longer than any countdown or backlog wait.
VISIBILITY_TIMEOUT = 12.0
#: At most this many calls per scenario.
MAX_CALLS = 70


@dataclass
class PlannedCall:
    """A call the driver makes ``at`` seconds after the workers are ready."""

    at: float
    mode: str
    key: str
    n: int
    seconds: float
    fail: bool = False
    countdown: float | None = None
    eta: float | None = None
    duplicate: bool = False


@dataclass
class PlannedFault:
    """A fault injected ``at`` seconds after the workers are ready; ``seconds`` is how long
    it lasts (a stall) or how long a killed worker stays down; ``pick`` chooses a target."""

    at: float
    kind: str
    seconds: float = 0.0
    pick: float = 0.0


@dataclass
class Scenario:
    """One generated scenario."""

    seed: int
    modes: list[str]
    workers: list[WorkerInfo]
    calls: list[PlannedCall]
    faults: list[PlannedFault]
    duration: float
    restarts: bool
    lease: float = LEASE
    visibility_timeout: float = VISIBILITY_TIMEOUT
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Scenario:
        """Read back :meth:`to_json`."""
        data = dict(raw)
        data["workers"] = [WorkerInfo(**item) for item in data["workers"]]
        data["calls"] = [PlannedCall(**item) for item in data["calls"]]
        data["faults"] = [PlannedFault(**item) for item in data["faults"]]
        return cls(**data)

    def summary(self) -> str:
        """One line: seed, modes, workers, calls, faults."""
        workers = " + ".join(f"{w.pool}×{w.concurrency}(prefetch {w.prefetch})"
                             for w in self.workers)  # fmt: skip
        faults = ", ".join(f"{f.kind}@{f.at:.1f}" for f in self.faults) or "none"
        return (
            f"seed {self.seed}: {', '.join(self.modes)} | workers {workers} | "
            f"{len(self.calls)} calls over {self.duration:.1f} s | faults {faults}"
        )


def _body_seconds(rng: random.Random, mode: str) -> float:
    if MODES[mode].debounce is not None:
        return round(rng.uniform(0.3, 1.2), 2)
    return round(rng.uniform(0.1, 0.8), 2)


def _calls_of(
    rng: random.Random, mode: str, keys: Sequence[str], duration: float
) -> list[PlannedCall]:
    """Bursts of 1-5 calls 20-400 ms apart, 0.3-2.5 s between bursts."""
    calls: list[PlannedCall] = []
    at = rng.uniform(0.0, 1.0)
    spec = MODES[mode]
    while at < duration:
        key = rng.choice(keys)
        for _ in range(rng.randint(1, 5)):
            timing = rng.random()
            calls.append(
                PlannedCall(
                    at=round(at, 3), mode=mode, key=key, n=0,
                    seconds=_body_seconds(rng, mode),
                    fail=spec.may_fail and rng.random() < 0.25,
                    countdown=round(rng.uniform(0.1, 2.0), 2) if timing < 0.2 else None,
                    eta=round(rng.uniform(0.2, 1.5), 2) if 0.2 <= timing < 0.27 else None,
                    duplicate=rng.random() < 0.08,
                )
            )  # fmt: skip
            at += rng.uniform(0.02, 0.4)
        at += rng.uniform(0.3, 2.5)
    return calls


def generate(
    seed: int,
    *,
    modes: Iterable[str] | None = None,
    restarts: bool | None = None,
    faults: Iterable[str] | None = None,
    duration: float | None = None,
) -> Scenario:
    """The scenario of ``seed``. ``modes``: which modes (default: 3-5 drawn); ``restarts``:
    whether it is of the restart class (default: one in four); ``faults``: kinds injected
    at least once each (default: 1-3 drawn); ``duration``: seconds of calls (default 6-10)."""
    rng = random.Random(seed)
    names = list(modes) if modes is not None else rng.sample(sorted(MODES), rng.randint(3, 5))
    unknown = [name for name in names if name not in MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    restart_class = restarts if restarts is not None else rng.random() < 0.25
    length = duration if duration is not None else round(rng.uniform(6.0, 10.0), 1)
    prefork_only = any(MODES[name].prefork_only for name in names)
    pool = "threads" if not prefork_only and rng.random() < 0.2 else "prefork"
    worker_count = rng.choice((1, 2, 2))
    workers = [
        WorkerInfo(f"w{index + 1}", pool, rng.choice((1, 2, 2, 3)), rng.choice((1, 1, 2, 4)))
        for index in range(worker_count)
    ]
    calls: list[PlannedCall] = []
    for name in names:
        keys = [f"k{index}" for index in range(rng.choice((1, 1, 2)))]
        calls += _calls_of(rng, name, keys, length)
    calls.sort(key=lambda call: call.at)
    del calls[MAX_CALLS:]
    for index, call in enumerate(calls):
        call.n = index
    kinds = list(faults) if faults is not None else []
    if faults is None:
        menu = ["child_kill", "worker_kill", "redis_stall"]
        kinds = rng.sample(menu, rng.randint(1, 3))
    if restart_class and "redis_restart" not in kinds:
        kinds.append("redis_restart")
    if not restart_class:
        kinds = [kind for kind in kinds if kind != "redis_restart"]
    if pool != "prefork":
        kinds = ["worker_kill" if kind == "child_kill" else kind for kind in kinds]
    planned = []
    for kind in kinds:
        if kind == "duplicate_publish":
            continue  # a property of calls (``duplicate``), not an event
        seconds = 0.0
        if kind == "redis_stall":
            seconds = round(rng.uniform(0.5, 3.5), 2)
        elif kind in ("worker_kill", "parked_kill"):
            seconds = round(rng.uniform(0.3, 1.5), 2)
        planned.append(PlannedFault(round(rng.uniform(1.0, length + 1.0), 2), kind, seconds,
                                    rng.random()))  # fmt: skip
    if faults is None and any(MODES[name].held_back for name in names):
        # A mode whose calls a limit or a rate holds back: a worker is also killed while
        # calls wait parked (drawn after everything else, so the rest of the plan is what
        # the seed gave before this fault existed).
        planned.append(PlannedFault(round(rng.uniform(1.0, length), 2), "parked_kill",
                                    round(rng.uniform(0.3, 1.5), 2), rng.random()))  # fmt: skip
    planned.sort(key=lambda fault: fault.at)
    return Scenario(seed, names, workers, calls, planned, length, restart_class)

"""The modes in the chaos soak: a second producer drives every mode of
:mod:`tests.invariants.modes` through the soak's workers and faults, and the invariant
checker (:mod:`tests.invariants.checker`) judges every call at the end.

The modes' tasks live on the soak's app (:mod:`benchmarks.soak.app`, ``soak.mode.<mode>``);
their bodies record to the soak's ledger server under ``modes:*`` (see
:mod:`tests.invariants.recording`), their results go to a result backend on the broker's
server, and the lock is the soak's faulted lock Redis. The producer makes calls in short
bursts over two keys per mode (countdowns, ETAs and duplicate publishes included),
keeping at most :data:`BACKLOG` result ids unfinished.

What the soak adds to the invariant runner's faults: worker pauses and network stalls past
the lease (so a holder may lose its lease: the checker then counts a body's hold until the
last moment it saw its lease valid) and restarts of a worker with a skewed wall clock.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.soak.analysis import Fault
from tests.invariants.checker import Verdict, check
from tests.invariants.driver import Driver
from tests.invariants.modes import MODES
from tests.invariants.recording import Recorder
from tests.invariants.records import FaultRecord, Observation, WorkerInfo
from tests.invariants.scenario import PlannedCall

if TYPE_CHECKING:
    from celery import Celery, Task

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = ["BACKLOG", "SOAK_MODES", "ModesProducer", "judge", "summary"]

#: Result ids of the modes' calls not ready yet, at most.
BACKLOG = 24
#: Keys per mode.
KEYS = ("m0", "m1")
#: The modes every soak runs: all of the invariant checker's (its report lists each).
SOAK_MODES: tuple[str, ...] = tuple(MODES)


class ModesProducer(threading.Thread):
    """Calls the modes' tasks in bursts until :attr:`halt`; follows their results."""

    def __init__(
        self,
        app: Celery,
        tasks: Mapping[str, AnyTask],
        recorder: Recorder,
        seed: int,
        modes: Sequence[str] = SOAK_MODES,
    ) -> None:
        super().__init__(name="soak-modes-producer", daemon=True)
        self.driver = Driver(app, tasks, recorder, say=lambda text: print(f"soak: {text}"))
        self.rng = random.Random(seed)
        self.modes = list(modes)
        self.halt = threading.Event()
        self.threads: list[threading.Thread] = []

    def plan(self, mode: str, key: str, n: int) -> PlannedCall:
        """One call of ``mode`` (like the invariant runner's, shorter bodies)."""
        rng, spec = self.rng, MODES[mode]
        timing = rng.random()
        return PlannedCall(
            at=0.0, mode=mode, key=key, n=n, seconds=round(rng.uniform(0.1, 0.6), 2),
            fail=spec.may_fail and rng.random() < 0.25,
            countdown=round(rng.uniform(0.1, 1.5), 2) if timing < 0.15 else None,
            eta=round(rng.uniform(0.2, 1.0), 2) if 0.15 <= timing < 0.2 else None,
            duplicate=rng.random() < 0.05,
        )  # fmt: skip

    def run(self) -> None:
        self.threads = self.driver.start()
        n = 0
        while not self.halt.is_set():
            if self.driver.waiting() >= BACKLOG:
                self.halt.wait(0.1)
                continue
            mode, key = self.rng.choice(self.modes), self.rng.choice(KEYS)
            for _ in range(self.rng.randint(1, 4)):
                if self.halt.is_set():
                    break
                self.driver.call(self.plan(mode, key, n))
                n += 1
                self.halt.wait(self.rng.uniform(0.02, 0.3))
            self.halt.wait(self.rng.uniform(0.1, 0.6))

    def unreceived_waiting(self) -> tuple[int, int]:
        """(result ids not ready yet, those of them no worker ever received)."""
        with self.driver.mutex:
            waiting = set(self.driver.pending)
        if not waiting:
            return 0, 0
        recorder = self.driver.recorder
        raw = recorder.client().lrange(recorder.key("received"), 0, -1)
        received = {str(json.loads(item)["task_id"]) for item in raw}
        return len(waiting), len(waiting - received)

    def stop(self) -> None:
        """Stop calling (results are still followed until :meth:`close`)."""
        self.halt.set()
        self.join(30)

    def close(self) -> None:
        """Stop following results: one last read of every id, then the final states."""
        self.driver.halt.set()
        for thread in self.threads:
            thread.join(15)
        self.driver.poll_once()
        self.driver.final_states()
        self.driver.close()


def judge(
    producer: ModesProducer,
    faults: Sequence[Fault],
    *,
    workers: Sequence[str],
    lease: float,
    visibility_timeout: float,
    ended: float,
    broker_left: Mapping[str, str] | None = None,
    save: Path | None = None,
) -> Verdict:
    """Read the ledger and judge every call of the modes (``broker_left``: task id ->
    where its message still is in the broker, for the report of a lost call). With
    ``save``, the records are written there too: ``python -m tests.invariants --recheck
    PATH`` judges them again."""
    recorded = producer.driver.recorder.read()
    records = [FaultRecord(f.kind, f.at, f.ended, f.target, f.detail, list(f.pids)) for f in faults]
    observation = Observation(
        seed=None, lease=lease, visibility_timeout=visibility_timeout,
        calls=list(producer.driver.calls), bodies=recorded.bodies, execs=recorded.execs,
        receipts=recorded.receipts, signals=recorded.signals, kills=recorded.kills,
        published=recorded.published,
        outcomes=dict(producer.driver.outcomes), faults=records,
        workers=[WorkerInfo(name, "prefork", 2, 1) for name in workers], ended=ended,
        # Workers paused, networks stalled and the lock Redis stopped past the lease: a
        # holder may lose its lease; its hold is counted until it last saw it valid.
        leases_may_be_lost=True, notes={"broker_left": dict(broker_left or {})},
    )  # fmt: skip
    if save is not None:
        observation.dump(save)
    return check(observation)


def summary(verdict: Verdict, limit: int = 12) -> dict[str, Any]:
    """What the soak's report shows of the modes: the checker's figures and examples."""
    return {
        **verdict.figures,
        "safe_violations": len(verdict.safe),
        "violations_after_restart_total": len(verdict.under_restart),
        "examples": [item.line() for item in verdict.safe[:limit]],
        "examples_after_restart": [item.line() for item in verdict.under_restart[:limit]],
        "examples_lost_in_transport": [item.line() for item in verdict.transport[:limit]],
    }

"""The fault injectors of the invariant runner: kills (of a pool process, of a whole worker,
of a whole worker while calls wait parked), lock Redis stalls and restarts.

Each injector acts on processes the runner started (by PID or process group, never by
name), records what it killed in the ledger *before* killing it (so a body's end is known:
a SIGKILLed process cannot record its own), lifts the fault (a stalled server continues, a
killed worker is started again, bounded), and returns a
:class:`~tests.invariants.records.FaultRecord`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celery_singleton_lock.testing import CeleryWorker, RedisServer
from tests.invariants.recording import Recorder
from tests.invariants.records import FaultRecord, WorkerInfo
from tests.invariants.scenario import PlannedFault

__all__ = ["PARKED_WAIT", "Injector", "WorkerSlot"]

#: The longest a ``parked_kill`` waits for a parked call before it kills a worker anyway.
PARKED_WAIT = 10.0


@dataclass
class WorkerSlot:
    """One worker of a run: its settings, how to start it, and its current process."""

    info: WorkerInfo
    make: Callable[[int], CeleryWorker]  # start number -> a new (unstarted) process
    process: CeleryWorker | None = None
    starts: int = 0
    history: list[int] = field(default_factory=list)  # main PIDs, one per start

    def start(self, *, wait: bool = True) -> None:
        """Start (or start again) this worker."""
        self.starts += 1
        self.process = self.make(self.starts)
        self.process.start(wait=wait)
        self.history.append(self.process.pid)

    def pids(self) -> list[int]:
        """The main process and its pool processes, while it runs."""
        if self.process is None or not self.process.alive():
            return []
        return [self.process.pid, *self.process.children()]


class Injector:
    """Injects the planned faults of one run."""

    def __init__(self, lock: RedisServer, workers: list[WorkerSlot], recorder: Recorder) -> None:
        self.lock = lock
        self.workers = workers
        self.recorder = recorder
        #: PIDs killed so far (the runner's watcher does not report them as vanished).
        self.killed: set[int] = set()
        self.paused = False

    def inject(self, fault: PlannedFault) -> FaultRecord:
        """Inject one planned fault and lift it."""
        method = getattr(self, fault.kind)
        record: FaultRecord = method(fault)
        return record

    def _pick(self, items: list[WorkerSlot], pick: float) -> WorkerSlot | None:
        running = [w for w in items if w.process is not None and w.process.alive()]
        if not running:
            return None
        return running[min(len(running) - 1, int(pick * len(running)))]

    def child_kill(self, fault: PlannedFault) -> FaultRecord:
        """SIGKILL one pool process, preferably one running a body of a mode's task."""
        prefork = [w for w in self.workers if w.info.pool == "prefork"]
        children = {pid: w for w in prefork for pid in w.pids()[1:]}
        busy = [b for b in self.recorder.open_bodies() if b.pid in children]
        now = time.monotonic()
        if busy:
            victim = busy[min(len(busy) - 1, int(fault.pick * len(busy)))].pid
        elif children:
            pids = sorted(children)
            victim = pids[min(len(pids) - 1, int(fault.pick * len(pids)))]
        else:
            return FaultRecord("child_kill", now, now, "", "no pool process to kill")
        worker = children[victim]
        at = time.monotonic()
        self.recorder.kill([victim], at, "child_kill")
        self.killed.add(victim)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        detail = f"pool process {victim}" + (" (running a body)" if busy else " (idle)")
        return FaultRecord("child_kill", at, at, worker.info.name, detail, [victim])

    def worker_kill(self, fault: PlannedFault) -> FaultRecord:
        """SIGKILL a whole worker (its process group), start it again ``seconds`` later."""
        worker = self._pick(self.workers, fault.pick)
        now = time.monotonic()
        if worker is None or worker.process is None:
            return FaultRecord("worker_kill", now, now, "", "no worker running")
        pids = worker.pids()
        at = time.monotonic()
        self.recorder.kill(pids, at, "worker_kill")
        self.killed.update(pids)
        worker.process.kill()
        time.sleep(fault.seconds)
        worker.start()
        detail = f"killed {len(pids)} processes, started again after {fault.seconds:g} s"
        return FaultRecord("worker_kill", at, time.monotonic(), worker.info.name, detail, pids)

    def parked_kill(self, fault: PlannedFault) -> FaultRecord:
        """SIGKILL a whole worker while calls wait parked: wait (at most ``PARKED_WAIT``
        seconds) until a call is held back by a limit or its rate (parked at position 0;
        else any parked call, once the wait is over: ``Recorder.parked_now``), kill the
        worker that last took a message of that call (else one by ``pick``), start it again
        ``seconds`` later. A parked call holds no worker, so none may wait for the broker
        to bring its message back (the checker's ``parked_in_worker``)."""
        deadline = time.monotonic() + PARKED_WAIT
        parked = self.recorder.parked_now()
        while time.monotonic() < deadline and not any(
            record.fields.get("position") == 0 for record, _ in parked
        ):
            time.sleep(0.1)
            parked = self.recorder.parked_now()
        running = {slot.info.name: slot for slot in self.workers if slot.pids()}
        worker = next((running[name] for _, name in parked if name in running), None)
        held = sum(1 for record, _ in parked if record.fields.get("position") == 0)
        how = f"{len(parked)} call(s) parked, {held} held back by a limit or a rate"
        if worker is None:
            worker = self._pick(self.workers, fault.pick)
        now = time.monotonic()
        if worker is None or worker.process is None:
            return FaultRecord("parked_kill", now, now, "", "no worker running")
        pids = worker.pids()
        at = time.monotonic()
        self.recorder.kill(pids, at, "parked_kill")
        self.killed.update(pids)
        worker.process.kill()
        time.sleep(fault.seconds)
        worker.start()
        detail = (f"{how}; killed {len(pids)} processes, started again after "
                  f"{fault.seconds:g} s")  # fmt: skip
        return FaultRecord("parked_kill", at, time.monotonic(), worker.info.name, detail, pids)

    def redis_stall(self, fault: PlannedFault) -> FaultRecord:
        """SIGSTOP the lock Redis for ``seconds`` (its data is kept), then SIGCONT."""
        at = time.monotonic()
        self.lock.pause()
        self.paused = True
        try:
            time.sleep(fault.seconds)
        finally:
            self.lock.resume()
            self.paused = False
        return FaultRecord("redis_stall", at, time.monotonic(), "lock redis",
                           f"stopped {fault.seconds:g} s")  # fmt: skip

    def redis_restart(self, fault: PlannedFault) -> FaultRecord:
        """Stop the lock Redis and start it empty on the same port: every lock, follow-up,
        burst, skip record, rate window and success hold is lost."""
        at = time.monotonic()
        self.lock.restart()
        return FaultRecord("redis_restart", at, time.monotonic(), "lock redis",
                           "restarted empty")  # fmt: skip

    def lift(self) -> None:
        """Let a stalled lock Redis run again (at the end, whatever happened)."""
        if self.lock.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.lock.process.pid, signal.SIGCONT)

"""Beat replicas under faults, with a ledger outside the lock Redis: the rig of
``tests/replicas/test_replicas.py`` and of ``python -m benchmarks.beat_failover``.

A :class:`Rig` owns a broker (a private redis-server that no fault touches; the ledger is
its database 2), a lock Redis (another one, with an append-only file so a restart can keep
its data), one :class:`~celery_singleton_lock.testing.FaultProxy` per beat replica in front
of the lock Redis, one ``celery worker`` and the beat replicas: ``LeaderScheduler`` (kind
``"ours"``) or RedBeat's scheduler with its documented HA settings (kind ``"redbeat"``).
Every process is started and stopped here, by PID or process group; every wait is bounded
and waits for an observable event (a send in the ledger), never for a guessed time.

:func:`analyse` judges the ledger: duplicates, slots lost beyond the catch-up rule, two
replicas sending in the same second, and failover times (fault -> first send by another
replica).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_singleton_lock.testing import CeleryBeat, CeleryWorker, FaultProxy, RedisServer

__all__ = ["ENTRIES", "Fault", "Rig", "Send", "analyse"]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.replicas.beatproj"
#: The entries of the schedule and their periods (seconds).
ENTRIES = {"fast": 1.0, "slow": 5.0, "byname": 1.0}


@dataclass
class Send:
    """One ledger line: a run of an entry, the slot it was sent for (ms; None under
    RedBeat, which names none), who sent it, when it was sent as leader (``sent_at``:
    LeaderScheduler's header; RedBeat: its publish) and when it was published."""

    entry: str
    slot: int | None
    sender: str
    sent_at: float
    published: float
    caught_up: bool


@dataclass
class Fault:
    """One fault: its kind, when it began and ended (``time.time()``), the replica it hit
    (``host:pid``) and the first send by another replica after it began."""

    kind: str
    began: float
    ended: float
    target: str | None
    failover: float | None = None


@dataclass
class Replica:
    """One beat replica: its proxy to the lock Redis and its current process."""

    name: str
    proxy: FaultProxy
    process: CeleryBeat | None = None
    starts: int = 0
    down: bool = False  # killed on purpose: not revived as a crash

    @property
    def sender(self) -> str | None:
        """``host:pid`` as its messages name it."""
        if self.process is None or self.process.process is None:
            return None
        return f"{os.uname().nodename}:{self.process.pid}"


@dataclass
class Rig:
    """The servers and processes of one run (see the module doc)."""

    kind: str
    run_dir: Path
    lease: float = 2.0
    replicas: int = 3
    catch_up: str = "once"
    broker: RedisServer = field(init=False)
    lock: RedisServer = field(init=False)
    worker: CeleryWorker | None = field(init=False, default=None)
    beats: list[Replica] = field(init=False, default_factory=list)
    faults: list[Fault] = field(init=False, default_factory=list)
    crashed: int = field(init=False, default=0)
    started_at: float = field(init=False, default=0.0)
    stopped_at: float = field(init=False, default=0.0)
    data_lost_at: list[float] = field(init=False, default_factory=list)
    #: The ledger as it was when the run stopped (read before the broker stops).
    final: list[Send] = field(init=False, default_factory=list)

    # -- processes -------------------------------------------------------------------------

    def env(self, lock_url: str) -> dict[str, str]:
        return {
            "CSL_BEAT_BROKER": self.broker.url,
            "CSL_BEAT_LOCK": lock_url,
            "CSL_BEAT_LEASE": repr(self.lease),
            "CSL_BEAT_CATCH_UP": self.catch_up,
            "CSL_BEAT_REDBEAT": "1" if self.kind == "redbeat" else "0",
            "PYTHONPATH": str(ROOT),
        }

    def start(self) -> None:
        """The servers, the worker and every replica (started side by side)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.broker = RedisServer().start()
        self.lock = RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always"))
        self.lock.start()
        self.worker = CeleryWorker(
            APP, env={**self.env(self.lock.url), "CSL_BEAT_ROLE": "worker"}, concurrency=2,
            cwd=ROOT, log_path=self.run_dir / f"{self.kind}-worker.log", ready_timeout=90,
        )  # fmt: skip
        self.worker.start(wait=False)
        for index in range(self.replicas):
            self.beats.append(Replica(f"beat{index}", FaultProxy(self.lock.port)))
        for replica in self.beats:
            self.start_beat(replica, wait=False)
        self.worker.wait_ready()
        for replica in self.beats:
            assert replica.process is not None
            replica.process.wait_ready(90)
        self.started_at = time.time()

    def start_beat(self, replica: Replica, *, wait: bool = True) -> None:
        """Start (or start again) ``replica``."""
        replica.starts += 1
        scheduler = (
            "redbeat.RedBeatScheduler"
            if self.kind == "redbeat"
            else "celery_singleton_lock.beat:LeaderScheduler"
        )
        timeout = max(0.5, self.lease / 2)
        url = f"{replica.proxy.url}?socket_timeout={timeout:g}&socket_connect_timeout={timeout:g}"
        replica.process = CeleryBeat(
            APP, extra_args=["-S", scheduler], env=self.env(url), cwd=ROOT,
            schedule=self.run_dir / f"{self.kind}-{replica.name}-schedule",
            log_path=self.run_dir / f"{self.kind}-{replica.name}-{replica.starts}.log",
            name=f"{self.kind}-{replica.name}", ready_timeout=90,
        )  # fmt: skip
        replica.process.start(wait=wait)

    def revive(self) -> None:
        """Start again every replica whose process ended by itself (as a supervisor would),
        counting them."""
        for replica in self.beats:
            if replica.process is not None and not replica.process.alive() and not replica.down:
                self.crashed += 1
                self.start_beat(replica, wait=False)

    def stop(self) -> None:
        """Stop every replica at once (SIGKILL: a graceful stop would hand the lease over
        mid-run), then the worker once the queue is drained, then the servers."""
        self.stopped_at = time.time()
        for replica in self.beats:
            replica.proxy.resume()
            if replica.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(replica.process.pid, signal.SIGCONT)
                replica.process.kill()
        self.drain()
        self.final = self.sends()
        if self.worker is not None:
            self.worker.stop(timeout=20)
        for replica in self.beats:
            replica.proxy.close()
        self.lock.stop()
        self.broker.stop()

    def drain(self, bound: float = 60.0) -> None:
        """Wait (bounded) until the worker ran everything published."""
        client = redis.Redis.from_url(self.broker.url, socket_timeout=10)
        deadline = time.monotonic() + bound
        settled = 0
        while time.monotonic() < deadline and settled < 3:
            queued = client.llen("beatproj") + client.hlen("unacked")
            settled = settled + 1 if queued == 0 else 0
            time.sleep(0.3)
        client.close()

    # -- the ledger ------------------------------------------------------------------------

    def sends(self) -> list[Send]:
        """Every send recorded so far, in the order of ``sent_at``."""
        client = redis.Redis.from_url(self.broker.url.rsplit("/", 1)[0] + "/2", socket_timeout=10)
        lines = [json.loads(raw) for raw in client.lrange("ledger", 0, -1)]
        client.close()
        found = []
        for line in lines:
            published = float(line.get("published") or line["received"])
            found.append(
                Send(
                    entry=line["entry"],
                    slot=line["slot"],
                    sender=str(line.get("sender") or "?"),
                    sent_at=float(line["sent_at"]) if line.get("sent_at") else published,
                    published=published,
                    caught_up=bool(line.get("caught_up")),
                )
            )
        found.sort(key=lambda send: send.sent_at)
        return found

    def leader(self) -> Replica | None:
        """The replica that sent last (the leader as the ledger sees it)."""
        sends = self.sends()
        if not sends:
            return None
        last = sends[-1].sender
        return next((replica for replica in self.beats if replica.sender == last), None)

    def wait_for(self, what: Callable[[list[Send]], bool], bound: float = 60.0) -> bool:
        """Poll the ledger until ``what(sends)`` holds (at most ``bound`` seconds)."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if what(self.sends()):
                return True
            self.revive()
            time.sleep(0.1)
        return False

    def wait_sends(self, count: int, since: float, bound: float = 60.0) -> bool:
        """Wait until ``count`` sends after ``since`` (``time.time()``) are in the ledger."""
        return self.wait_for(lambda sends: sum(s.sent_at > since for s in sends) >= count, bound)

    def wait_other_sender(self, target: str | None, since: float, bound: float = 60.0) -> bool:
        """Wait until a replica other than ``target`` sent after ``since``."""
        return self.wait_for(
            lambda sends: any(s.sent_at > since and s.sender != target for s in sends), bound
        )

    # -- the faults ------------------------------------------------------------------------

    def _leader_or_fail(self) -> Replica:
        found = self.leader()
        if found is None or found.process is None:
            raise RuntimeError("no leader found in the ledger")
        return found

    def kill_leader(self, *, restart: bool = True) -> Fault:
        """SIGKILL the leader (its whole process group); start it again afterwards."""
        replica = self._leader_or_fail()
        target = replica.sender
        assert replica.process is not None
        began = time.time()
        replica.down = True
        replica.process.kill()
        fault = Fault("leader_kill", began, began, target)
        self.faults.append(fault)
        self.wait_other_sender(target, began)
        if restart:
            self.start_beat(replica, wait=False)
            replica.down = False
        return fault

    def stop_leader(self, pause: float) -> Fault:
        """SIGSTOP the leader for ``pause`` seconds (past its lease), then SIGCONT."""
        replica = self._leader_or_fail()
        assert replica.process is not None
        target = replica.sender
        began = time.time()
        os.killpg(replica.process.pid, signal.SIGSTOP)
        try:
            self.wait_other_sender(target, began, bound=pause + 60)
            time.sleep(max(0.0, began + pause - time.time()))
        finally:
            os.killpg(replica.process.pid, signal.SIGCONT)
        fault = Fault("leader_stop", began, time.time(), target)
        self.faults.append(fault)
        return fault

    def cut_leader(self, pause: float) -> Fault:
        """Stall every byte between the leader and the lock Redis for ``pause`` seconds
        (a partition: its connections stay open, nothing flows), then let them flow."""
        replica = self._leader_or_fail()
        target = replica.sender
        began = time.time()
        replica.proxy.stall()
        try:
            self.wait_other_sender(target, began, bound=pause + 60)
            time.sleep(max(0.0, began + pause - time.time()))
        finally:
            replica.proxy.resume()
        fault = Fault("leader_cut", began, time.time(), target)
        self.faults.append(fault)
        return fault

    def restart_lock(self, *, keep_data: bool) -> Fault:
        """Restart the lock Redis on the same port, with its data (append-only file) or
        empty."""
        began = time.time()
        if keep_data:
            self.lock.restart(keep_data=True)
        else:
            self.lock.restart()
            self.data_lost_at.append(began)
        kind = "redis_restart_kept" if keep_data else "redis_restart_lost"
        fault = Fault(kind, began, time.time(), None)
        self.faults.append(fault)
        return fault


# -- judging the ledger ---------------------------------------------------------------------


def _failover(fault: Fault, sends: list[Send]) -> float | None:
    """Seconds from the fault to the first send by another replica (any replica after a
    restart of the lock Redis, which hits none)."""
    for send in sends:
        if send.sent_at > fault.began and (fault.target is None or send.sender != fault.target):
            return round(send.sent_at - fault.began, 3)
    return None


def _near(moment: float, marks: list[float], after: float) -> bool:
    return any(mark <= moment <= mark + after for mark in marks)


def analyse(rig: Rig, sends: list[Send]) -> dict[str, Any]:
    """The figures of a run (see the module doc). Slots are exact under LeaderScheduler;
    under RedBeat, which names none, a send is a duplicate when it follows the entry's
    previous send by less than half a period, and a gap of ``g`` periods loses ``g - 1``
    slots (rounded)."""
    for fault in rig.faults:
        fault.failover = _failover(fault, sends)
    window_end = rig.stopped_at - rig.lease - 2
    after_loss = rig.lease + 5.0
    by_entry: dict[str, list[Send]] = defaultdict(list)
    for send in sends:
        by_entry[send.entry].append(send)
    duplicates = duplicates_after_loss = 0
    lost = lost_by_rule = lost_after_loss = 0
    examples: list[str] = []
    for entry, runs in by_entry.items():
        period_ms = int(ENTRIES.get(entry, 1.0) * 1000)
        exact = all(send.slot is not None for send in runs)
        if exact:
            seen: dict[int, Send] = {}
            for send in runs:
                assert send.slot is not None
                if send.slot in seen:
                    if _near(send.sent_at, rig.data_lost_at, after_loss):
                        duplicates_after_loss += 1
                    else:
                        duplicates += 1
                        examples.append(f"duplicate {entry} slot {send.slot} by {send.sender}")
                seen[send.slot] = send
            ordered = sorted(seen.values(), key=lambda send: send.slot or 0)
            for before, after in itertools.pairwise(ordered):
                assert before.slot is not None
                assert after.slot is not None
                if after.sent_at > window_end:
                    break
                gap = round((after.slot - before.slot) / period_ms) - 1
                if gap <= 0:
                    continue
                if _near(after.sent_at, rig.data_lost_at, after_loss):
                    lost_after_loss += gap
                elif after.caught_up or rig.catch_up == "skip":
                    lost_by_rule += gap
                else:
                    lost += gap
                    examples.append(f"lost {gap} slot(s) of {entry} before {after.slot}")
        else:
            ordered = sorted(runs, key=lambda send: send.published)
            for before, after in itertools.pairwise(ordered):
                if after.published > window_end:
                    break
                gap_periods = (after.published - before.published) / (period_ms / 1000)
                if gap_periods < 0.5:
                    if _near(after.published, rig.data_lost_at, after_loss):
                        duplicates_after_loss += 1
                    else:
                        duplicates += 1
                        examples.append(f"duplicate {entry} at {after.published:.3f}")
                elif round(gap_periods) > 1:
                    missing = round(gap_periods) - 1
                    if _near(after.published, rig.data_lost_at, after_loss):
                        lost_after_loss += missing
                    else:
                        lost += missing
    seconds: dict[int, set[str]] = defaultdict(set)
    for send in sends:
        if not _near(send.sent_at, rig.data_lost_at, after_loss):
            seconds[int(send.sent_at)].add(send.sender)
    shared = sorted(second for second, senders in seconds.items() if len(senders) > 1)
    late = sum(send.published - send.sent_at > 1.0 for send in sends)
    failovers = {
        kind: [f.failover for f in rig.faults if f.kind == kind]
        for kind in dict.fromkeys(fault.kind for fault in rig.faults)
    }
    return {
        "kind": rig.kind,
        "lease": rig.lease,
        "replicas": rig.replicas,
        "catch_up": rig.catch_up,
        "seconds": round(rig.stopped_at - rig.started_at, 1),
        "sends": len(sends),
        "duplicates": duplicates,
        "lost": lost,
        "lost_by_catch_up_rule": lost_by_rule,
        "duplicates_after_data_loss": duplicates_after_loss,
        "lost_after_data_loss": lost_after_loss,
        "seconds_with_two_senders": len(shared),
        "late_publishes": late,
        "replicas_crashed": rig.crashed,
        "failover_seconds": failovers,
        "faults": [asdict(fault) for fault in rig.faults],
        "examples": examples[:20],
    }

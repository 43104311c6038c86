"""The processes of a soak and the faults injected into them.

A :class:`Rig` owns three private ``redis-server`` processes (locks, broker, ledger), one
:class:`~celery_singleton_lock.testing.FaultProxy` per worker between that worker and the
lock Redis, the ``celery worker`` processes and the ``celery beat``. Every process is
started here and stopped here, by PID or process group; every wait is bounded. Every
worker and beat runs the code of the soak's snapshot (:mod:`benchmarks.soak.code`), also
when it is started again mid-soak, never the working tree as it is at that moment.

Each fault function injects one fault, lifts it (a paused process continues, a killed
worker is started again), and returns a :class:`~benchmarks.soak.analysis.Fault` with
the bodies its target held when it began.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks.soak.analysis import Fault
from benchmarks.soak.code import Code
from benchmarks.soak.ledger import Ledger
from celery_singleton_lock.beat.scheduler import group_key
from celery_singleton_lock.beat.state import read_group
from celery_singleton_lock.testing import (
    CeleryBeat,
    CeleryWorker,
    FaultProxy,
    RedisServer,
)

__all__ = ["FAULTS", "Rig", "SoakWorker", "results_url"]

ROOT = Path(__file__).resolve().parents[2]
APP = "benchmarks.soak.app"
#: How many ``celery beat`` replicas run (LeaderScheduler: one leads, the others stand by).
BEAT_REPLICAS = 3
#: Every worker's lock client gives up on a call after this long (seconds).
LOCK_SOCKET_TIMEOUT = 2.0


@dataclass
class SoakWorker:
    """One ``celery worker`` of the soak: its name, its proxy to the lock Redis, the wall
    clock offset of its pool processes, and its current process (replaced on restart)."""

    name: str
    proxy: FaultProxy
    skew: float = 0.0
    process: CeleryWorker | None = None
    starts: int = 0

    def pids(self) -> set[int]:
        """The main process and its pool processes."""
        if self.process is None or not self.process.alive():
            return set()
        return {self.process.pid, *self.process.children()}


@dataclass
class Rig:
    """The servers, proxies, workers and beat of one soak."""

    lock: RedisServer
    broker: RedisServer
    ledger_server: RedisServer
    workers: list[SoakWorker]
    run_dir: Path  # absolute: the processes run in the snapshot's directory
    lease: float
    kinds_of_keys: dict[str, str]
    code: Code
    ledger: Ledger = field(init=False)
    beats: list[CeleryBeat] = field(default_factory=list)
    beat_starts: int = 0
    lock_commands: int = 0  # counted before each restart of the lock Redis
    _info_calls: int = 0
    #: Told (pids, monotonic time, fault kind) just before processes are SIGKILLed: the
    #: modes' ledger records the end of the bodies they ran.
    on_kill: Callable[[list[int], float, str], None] | None = None

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.ledger_server.url)

    # -- environment and processes -------------------------------------------------------

    def env(self, label: str, lock_url: str) -> dict[str, str]:
        """The environment of a soak process (see :mod:`benchmarks.soak.app`): it imports
        the snapshot of the code."""
        return {
            "CSL_SOAK_BROKER": self.broker.url,
            "CSL_SOAK_RESULTS": results_url(self.broker.url),
            "CSL_SOAK_LOCK": lock_url,
            "CSL_SOAK_LEDGER": self.ledger_server.url,
            "CSL_SOAK_LEASE": repr(self.lease),
            "CSL_SOAK_WORKER": label,
            **self.code.env(),
        }

    @property
    def cwd(self) -> Path:
        """Where a soak process runs: the snapshot (``python -m`` puts it first on the
        path)."""
        return self.code.root

    def lock_url_via(self, proxy: FaultProxy) -> str:
        """The lock URL a worker uses: through its proxy, with a short socket timeout."""
        timeout = f"{LOCK_SOCKET_TIMEOUT:g}"
        return f"{proxy.url}?socket_timeout={timeout}&socket_connect_timeout={timeout}"

    def start_worker(self, worker: SoakWorker, *, wait: bool = True) -> None:
        """Start (or start again) ``worker``: prefork, concurrency 2."""
        worker.starts += 1
        env = self.env(worker.name, self.lock_url_via(worker.proxy))
        if worker.skew:
            env["CSL_SOAK_CLOCK_SKEW"] = repr(worker.skew)
        worker.process = CeleryWorker(
            APP, pool="prefork", concurrency=2, hostname=f"{worker.name}@%h", env=env,
            cwd=self.cwd, log_path=self.run_dir / f"{worker.name}-{worker.starts}.log",
            ready_timeout=90,
        )  # fmt: skip
        worker.process.start(wait=wait)

    def start(self) -> None:
        """Every worker (started side by side, then waited for), then the beat."""
        for worker in self.workers:
            self.start_worker(worker, wait=False)
        for worker in self.workers:
            assert worker.process is not None
            worker.process.wait_ready()
        for index in range(BEAT_REPLICAS):
            self.beats.append(self.start_beat(index, wait=False))
        for beat in self.beats:
            beat.wait_ready()

    def start_beat(self, index: int, *, wait: bool = True) -> CeleryBeat:
        """Start beat replica ``index`` (``LeaderScheduler``; one of them leads)."""
        self.beat_starts += 1
        beat = CeleryBeat(
            APP, schedule=self.run_dir / f"beat{index}-schedule", max_interval=1,
            extra_args=["-S", "celery_singleton_lock.beat:LeaderScheduler"],
            env=self.env(f"beat{index}", self.lock.url), cwd=self.cwd, name=f"beat{index}",
            log_path=self.run_dir / f"beat{index}-{self.beat_starts}.log", ready_timeout=90,
        )  # fmt: skip
        beat.start(wait=wait)
        return beat

    def beat_leader(self) -> int | None:
        """The index of the beat replica that leads now, per the lock Redis."""
        with redis.Redis(port=self.lock.port, socket_timeout=10) as client:
            state = read_group(client, group_key("csl", "csl_soak"))
        pid = state.leader["pid"] if state.leader else None
        return next((i for i, beat in enumerate(self.beats) if beat.alive() and beat.pid == pid),
                    None)  # fmt: skip

    def stop_beat(self) -> None:
        for beat in self.beats:
            beat.stop(timeout=10)

    def stop(self) -> None:
        """Stop everything this rig started (a paused process is let go first)."""
        self.lock_resume()
        for worker in self.workers:
            worker.proxy.resume()
            if worker.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.process.pid, signal.SIGCONT)
        self.stop_beat()
        for worker in self.workers:
            if worker.process is not None:
                worker.process.terminate()
        for worker in self.workers:
            if worker.process is not None:
                worker.process.stop(timeout=20, terminate=False)

    def lock_resume(self) -> None:
        if self.lock.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.lock.process.pid, signal.SIGCONT)

    # -- what the lock Redis did ----------------------------------------------------------

    def count_lock_commands(self) -> int:
        """Commands the lock Redis processed so far (its counters restart with it); the
        INFO calls that read them are not counted."""
        with redis.Redis(port=self.lock.port, socket_timeout=10) as client:
            total = int(client.info("stats")["total_commands_processed"])
        self._info_calls += 1
        return self.lock_commands + total - self._info_calls

    # -- who holds what --------------------------------------------------------------------

    def held(self, pids: set[int] | None = None) -> list[tuple[str, str, str, int, str]]:
        """(body id, key, task kind, pid, worker) of the bodies running now in live pool
        processes (of ``pids`` only, when given)."""
        live = set().union(*(worker.pids() for worker in self.workers))
        rows = []
        for body_id, (key, pid, worker) in self.ledger.active().items():
            if pid in live and (pids is None or pid in pids):
                rows.append((body_id, key, self.kinds_of_keys.get(key, "?"), pid, worker))
        return rows

    def killing(self, pids: list[int], at: float, kind: str) -> None:
        """Report processes about to be SIGKILLed (to :attr:`on_kill`)."""
        if self.on_kill is not None and pids:
            self.on_kill(pids, at, kind)

    def pick_worker(self, rng: random.Random) -> SoakWorker:
        """A running worker, preferring one whose pool processes hold a lock now."""
        running = [w for w in self.workers if w.process is not None and w.process.alive()]
        holding = [w for w in running if self.held(w.pids())]
        return rng.choice(holding or running)


def _held_of(rig: Rig, worker: SoakWorker) -> list[tuple[str, str, str]]:
    return [(body, key, kind) for body, key, kind, _, _ in rig.held(worker.pids())]


def results_url(broker_url: str) -> str:
    """The result backend of the modes' tasks: database 1 of the broker's server."""
    return broker_url.rsplit("/", 1)[0] + "/1"


# -- the faults ---------------------------------------------------------------------------


def child_kill(rig: Rig, rng: random.Random) -> Fault:
    """SIGKILL one pool process, preferably one running a locked body."""
    held = rig.held()
    if held:
        _, _, _, pid, name = rng.choice(held)
    else:
        worker = rig.pick_worker(rng)
        assert worker.process is not None
        children = worker.process.children()
        if not children:
            now = time.monotonic()
            return Fault("child_kill", now, now, worker.name, "no pool process found")
        pid, name = rng.choice(children), worker.name
    victims = [(body, key, kind) for body, key, kind, owner, _ in held if owner == pid]
    at = time.monotonic()
    rig.killing([pid], at, "child_kill")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return Fault("child_kill", at, at, name, f"pool process {pid}", victims, [pid])


def worker_kill(rig: Rig, rng: random.Random) -> Fault:
    """SIGKILL a whole worker (main process and pool), then start it again."""
    worker = rig.pick_worker(rng)
    victims = _held_of(rig, worker)
    assert worker.process is not None
    pids = sorted(worker.pids())
    at = time.monotonic()
    rig.killing(pids, at, "worker_kill")
    worker.process.kill()
    time.sleep(rng.uniform(0.5, 2.0))
    rig.start_worker(worker)
    return Fault(
        "worker_kill", at, time.monotonic(), worker.name, "killed and restarted", victims, pids
    )


def worker_stop(rig: Rig, rng: random.Random) -> Fault:
    """SIGSTOP a whole worker for longer than the lease, then SIGCONT."""
    worker = rig.pick_worker(rng)
    victims = _held_of(rig, worker)
    assert worker.process is not None
    pause = rig.lease + rng.uniform(1.5, 3.0)
    at = time.monotonic()
    os.killpg(worker.process.pid, signal.SIGSTOP)
    try:
        time.sleep(pause)
    finally:
        os.killpg(worker.process.pid, signal.SIGCONT)
    return Fault(
        "worker_stop", at, time.monotonic(), worker.name, f"stopped {pause:.1f} s", victims
    )


def redis_stop(rig: Rig, rng: random.Random) -> Fault:
    """SIGSTOP the lock Redis for a few seconds (its data is kept)."""
    pause = rng.uniform(2.0, 4.0)
    victims = [(body, key, kind) for body, key, kind, _, _ in rig.held()]
    at = time.monotonic()
    rig.lock.pause()
    try:
        time.sleep(pause)
    finally:
        rig.lock.resume()
    return Fault(
        "redis_stop", at, time.monotonic(), "lock redis", f"stopped {pause:.1f} s", victims
    )


def redis_restart(rig: Rig, rng: random.Random) -> Fault:
    """Restart the lock Redis empty on the same port: every lock is lost."""
    victims = [(body, key, kind) for body, key, kind, _, _ in rig.held()]
    rig.lock_commands = rig.count_lock_commands()
    rig._info_calls = 0  # the new server's counters start at zero
    at = time.monotonic()
    rig.lock.restart()
    return Fault("redis_restart", at, time.monotonic(), "lock redis", "restarted empty", victims)


def net_stall(rig: Rig, rng: random.Random) -> Fault:
    """Stall every byte between one worker and the lock Redis for longer than the lease."""
    worker = rig.pick_worker(rng)
    victims = _held_of(rig, worker)
    pause = rig.lease + rng.uniform(1.0, 2.0)
    at = time.monotonic()
    worker.proxy.stall()
    try:
        time.sleep(pause)
    finally:
        worker.proxy.resume()
    return Fault("net_stall", at, time.monotonic(), worker.name, f"stalled {pause:.1f} s", victims)


def net_cut(rig: Rig, rng: random.Random) -> Fault:
    """Close every connection between one worker and the lock Redis."""
    worker = rig.pick_worker(rng)
    victims = _held_of(rig, worker)
    at = time.monotonic()
    cut = worker.proxy.cut()
    return Fault("net_cut", at, at, worker.name, f"{cut} connections cut", victims)


def clock_skew(rig: Rig, rng: random.Random) -> Fault:
    """Restart a worker (warm shutdown) with its pool processes' wall clock far off:
    10 minutes to a day, ahead or behind."""
    unskewed = [w for w in rig.workers if not w.skew] or rig.workers
    worker = rng.choice(unskewed)
    skew = rng.choice((-1, 1)) * rng.uniform(600, 86400)
    at = time.monotonic()
    if worker.process is not None:
        worker.process.stop(timeout=20)
    worker.skew = skew
    rig.start_worker(worker)
    detail = f"wall clock {skew:+.0f} s"
    return Fault("clock_skew", at, time.monotonic(), worker.name, detail)


def beat_kill(rig: Rig, rng: random.Random) -> Fault:
    """SIGKILL the leading beat replica, then start it again (it stands by)."""
    index = rig.beat_leader()
    at = time.monotonic()
    if index is None:
        return Fault("beat_kill", at, at, "beat", "no beat leader found")
    beat = rig.beats[index]
    pid = beat.pid
    beat.kill()
    time.sleep(rng.uniform(0.5, 2.0))
    rig.beats[index] = rig.start_beat(index, wait=False)
    return Fault("beat_kill", at, time.monotonic(), f"beat{index}", f"leader pid {pid} killed")


FAULTS: dict[str, Callable[[Rig, random.Random], Fault]] = {
    "child_kill": child_kill,
    "worker_kill": worker_kill,
    "worker_stop": worker_stop,
    "redis_stop": redis_stop,
    "redis_restart": redis_restart,
    "net_stall": net_stall,
    "net_cut": net_cut,
    "clock_skew": clock_skew,
    "beat_kill": beat_kill,
}

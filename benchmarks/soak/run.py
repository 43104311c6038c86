"""Run the chaos soak: ``python -m benchmarks.soak [--minutes N] [--json PATH] [--markdown PATH]``.

Three real ``celery worker`` processes (prefork, concurrency 2, ``acks_late``), three
``celery beat`` replicas (``LeaderScheduler``: one leads, its leader is SIGKILLed among the
faults) with a locked periodic job, and private ``redis-server`` processes for the
locks, the broker and the ledger. For ``--minutes`` a producer keeps a steady stream of
locked tasks over a few keys (run scope waiting or retrying, queue scope), and a second
one calls every mode (:mod:`benchmarks.soak.modes`: coalesce, replace, debounce,
throttles, slots, lifetimes), while faults of every kind are injected at random moments,
in rounds that each cover every kind in a random order. Every worker and beat runs from a
snapshot of the code taken as the soak starts (:mod:`benchmarks.soak.code`), so an edit
of the working tree meanwhile cannot reach a process restarted mid-soak; each reports
what it imported, and one that ran other code fails the soak. Then the producers and beat stop,
the queue drains (bounded), the ledger is judged (:mod:`benchmarks.soak.analysis`) and
every call of the modes is checked (:mod:`tests.invariants.checker`). Exit status 1 when
a safety target was missed (the modes' invariants count, except across a restart of the
lock Redis), 2 when the soak could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

from benchmarks.soak.analysis import Fault, analyse, beat_figures, code_figures
from benchmarks.soak.code import imported
from benchmarks.soak.code import snapshot as snapshot_code
from benchmarks.soak.modes import ModesProducer, judge, summary
from benchmarks.soak.report import markdown
from benchmarks.soak.rig import FAULTS, ROOT, Rig, SoakWorker, results_url
from celery_singleton_lock.exceptions import LockBackendError
from celery_singleton_lock.testing import FaultProxy, RedisServer, find_redis_server
from tests.invariants.driver import broker_leftovers

__all__ = ["SoakConfig", "main", "run_soak"]

#: Seconds after the start before the first fault, and kept fault-free before the end
#: (so the last fault's recovery is measured while tasks still flow).
WARM_UP = 6.0
QUIET_END = 12.0
#: The longest a fault takes (a worker restart, a pause past the lease): a fault is not
#: started when it could run into the quiet end.
LONGEST_FAULT = 12.0
#: Tasks published but not finished at most (a steady backlog: constant contention).
BACKLOG = 12
#: How long the queue may take to drain after the producer stops: a killed worker's
#: messages come back after the visibility timeout (30 s) and a sweep.
DRAIN_TIMEOUT = 90.0
#: Seconds past the visibility timeout after which a message no worker received is lost.
TRANSPORT_SETTLE = 8.0


@dataclass
class SoakConfig:
    """What to run."""

    minutes: float = 10.0
    lease: float = 3.0
    workers: int = 3
    seed: int = 0
    gap: tuple[float, float] = (4.0, 9.0)  # seconds between faults
    run_dir: Path | None = None
    kinds: tuple[str, ...] = tuple(FAULTS)


@dataclass
class ProducerStats:
    published: int = 0
    deduplicated: int = 0
    refused: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Producer(threading.Thread):
    """Publishes locked tasks over a few keys, keeping about ``BACKLOG`` unfinished."""

    def __init__(self, app: ModuleType, rig: Rig, seed: int) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.app = app
        self.rig = rig
        self.rng = random.Random(seed)
        self.stats = ProducerStats()
        self.halt = threading.Event()

    def run(self) -> None:
        tasks = [(self.app.run_wait, 4), (self.app.run_retry, 2), (self.app.queued, 2)]
        weights = [weight for _, weight in tasks]
        while not self.halt.is_set():
            if self.rig.ledger.in_flight() >= BACKLOG:
                self.halt.wait(0.05)
                continue
            task = self.rng.choices([task for task, _ in tasks], weights)[0]
            key = self.rng.choice(self.app.KEYS[task.name])
            task_id = uuid.uuid4().hex
            try:
                result = task.apply_async((key, self.rng.randint(2, 6)), task_id=task_id)
            except LockBackendError:
                self.stats.refused += 1  # queue scope with the lock Redis unreachable
                self.halt.wait(0.2)
                continue
            except Exception as exc:  # keep producing; the report shows what failed
                name = type(exc).__name__
                self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
                self.halt.wait(0.2)
                continue
            if result.id == task_id:
                self.stats.published += 1
            else:
                self.stats.deduplicated += 1
            self.halt.wait(0.02)


def _fault_rounds(kinds: Sequence[str], rng: random.Random) -> Iterator[str]:
    """Rounds of every kind, each round in a random order."""
    while True:
        order = list(kinds)
        rng.shuffle(order)
        yield from order


def _say(message: str) -> None:
    print(message, flush=True)


def _versions() -> dict[str, Any]:
    server = find_redis_server() or "redis-server"
    try:
        version = subprocess.run(
            [server, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split(" sha=")[0]
    except OSError:
        version = "unknown"
    return {
        "python": platform.python_version(),
        "celery": importlib.metadata.version("celery"),
        "kombu": importlib.metadata.version("kombu"),
        "redis_py": importlib.metadata.version("redis"),
        "redis_server": version.strip(),
        "platform": platform.platform(terse=True),
        "cpus": os.cpu_count(),
    }


def run_soak(config: SoakConfig, command: str = "") -> dict[str, Any]:
    """Run one soak and return its report (the JSON form)."""
    rng = random.Random(config.seed)
    started_wall = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    began = time.monotonic()
    run_dir = (config.run_dir or Path(tempfile.mkdtemp(prefix="csl-soak-"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    faults: list[Fault] = []
    with contextlib.ExitStack() as stack:
        # The code every worker and beat runs, for the whole soak (what this process
        # imported must be the same).
        driver = imported()
        code_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        code = snapshot_code(ROOT, code_dir / "code")
        if (driver["digest"], driver["scripts"]) != (code.digest, code.scripts):
            raise RuntimeError(f"the tree at {ROOT} changed as the soak started")
        lock = stack.enter_context(RedisServer())
        broker = stack.enter_context(RedisServer())
        ledger_server = stack.enter_context(RedisServer())
        proxies = [stack.enter_context(FaultProxy(lock.port)) for _ in range(config.workers)]
        os.environ.update(
            CSL_SOAK_BROKER=broker.url, CSL_SOAK_LOCK=lock.url, CSL_SOAK_LEDGER=ledger_server.url,
            CSL_SOAK_RESULTS=results_url(broker.url),
            CSL_SOAK_LEASE=repr(config.lease), CSL_SOAK_WORKER="driver",
        )  # fmt: skip
        app = importlib.import_module("benchmarks.soak.app")
        kinds_of_keys = {key: task for task, keys in app.KEYS.items() for key in keys}
        workers = [SoakWorker(f"w{index + 1}", proxy) for index, proxy in enumerate(proxies)]
        workers[-1].skew = 3600.0  # one worker's wall clock is an hour ahead from the start
        rig = Rig(lock, broker, ledger_server, workers, run_dir, config.lease, kinds_of_keys, code)
        stack.callback(rig.stop)
        _say(f"soak: servers up, starting {config.workers} workers and beat (logs: {run_dir})")
        rig.start()
        ready = time.monotonic()
        producer = Producer(app, rig, rng.randrange(2**32))
        # Its own seed: the main producer and the faults stay those of --seed.
        modes = ModesProducer(
            app.app,
            app.MODE_TASKS,
            app.MODES_RECORDER,
            random.Random(config.seed + 1).randrange(2**32),
        )

        def on_kill(pids: list[int], at: float, kind: str) -> None:
            app.MODES_RECORDER.kill(pids, at, kind)
            modes.driver.killed.update(pids)

        rig.on_kill = on_kill
        producer.start()
        modes.start()
        stack.callback(producer.halt.set)
        stack.callback(modes.driver.close)
        stack.callback(modes.halt.set)
        end = ready + config.minutes * 60
        kinds = _fault_rounds(config.kinds, rng)
        next_at = ready + WARM_UP
        while next_at + LONGEST_FAULT < end - QUIET_END:
            time.sleep(max(0.0, next_at - time.monotonic()))
            kind = next(kinds)
            fault = FAULTS[kind](rig, rng)
            faults.append(fault)
            keys = ", ".join(key for _, key, _ in fault.held) or "no lock held"
            _say(f"soak: t={fault.at - ready:7.1f} s  {kind:<13} {fault.target:<10} "
                 f"{fault.detail} ({keys})")  # fmt: skip
            next_at = time.monotonic() + rng.uniform(*config.gap)
        time.sleep(max(0.0, end - time.monotonic()))
        producer.halt.set()
        modes.halt.set()
        producer.join(30)
        modes.stop()
        rig.stop_beat()
        fault_end = time.monotonic()
        _say(f"soak: producer and beat stopped; draining (at most {DRAIN_TIMEOUT:g} s)")
        drain_deadline = fault_end + DRAIN_TIMEOUT
        # A message no worker ever received, still missing once a killed worker's messages
        # had time to come back (visibility timeout + a sweep), was lost by the transport.
        settled = fault_end + app.VISIBILITY_TIMEOUT + TRANSPORT_SETTLE
        while time.monotonic() < drain_deadline:
            pending, unreceived = rig.ledger.unreceived_in_flight()
            waiting, never = modes.unreceived_waiting()
            settled_now = time.monotonic() > settled
            if (pending == 0 or (pending == unreceived and settled_now)) and (
                waiting == 0 or (waiting == never and settled_now)
            ):
                break
            time.sleep(0.5)
        drained = time.monotonic()
        lock_commands = rig.count_lock_commands()
        snapshot = rig.ledger.snapshot()
        beat_sends = [json.loads(line) for line in rig.ledger.client.lrange(app.BEAT_SENT, 0, -1)]
        elections = [json.loads(line) for line in rig.ledger.client.lrange(app.BEAT_ELECTED, 0, -1)]
        code_reports = {
            name: json.loads(text)
            for name, text in rig.ledger.client.hgetall(app.CODE_REPORTS).items()
        }
        started = rig.beat_starts + sum(worker.starts for worker in workers)
        modes.close()
        with redis.Redis(port=broker.port, socket_timeout=10) as client:
            left = broker_leftovers(client, app.app.conf.task_default_queue)
        verdict = judge(
            modes, faults, workers=[worker.name for worker in workers], lease=config.lease,
            visibility_timeout=app.VISIBILITY_TIMEOUT, ended=time.monotonic(), broker_left=left,
            save=run_dir / "modes-observation.json",
        )  # fmt: skip
        rig.stop()
    own, children = os.times(), os.times()
    cpu = own.user + own.system + children.children_user + children.children_system
    results = analyse(
        snapshot, faults, lease=config.lease, lock_commands=lock_commands,
        modes=summary(verdict),
        beat=beat_figures(beat_sends, elections, faults, lease=config.lease),
        code=code_figures(code.as_json(), code_reports, started),
    )  # fmt: skip
    report: dict[str, Any] = {
        "command": command,
        "started": started_wall.isoformat(),
        "config": {
            "minutes": config.minutes,
            "lease": config.lease,
            "workers": config.workers,
            "seed": config.seed,
            "gap_s": list(config.gap),
            "kinds": list(config.kinds),
            "backlog": BACKLOG,
            "run_dir": str(config.run_dir or run_dir),
        },
        "environment": _versions(),
        "passed": results.safe,
        "figures": results.figures,
        "targets": results.targets,
        "faults": [
            {
                "t": round(f.at - ready, 2),
                "duration_s": round(f.ended - f.at, 2),
                "kind": f.kind,
                "target": f.target,
                "detail": f.detail,
                "held": [list(h) for h in f.held],
            }
            for f in faults
        ],
        "recoveries": [
            {
                **row,
                "at": round(row["at"] - ready, 2),
                "seconds": None if row["seconds"] is None else round(row["seconds"], 3),
            }
            for row in results.recoveries
        ],
        "examples": results.examples,
        "producer": asdict(producer.stats),
        "modes_producer": {"calls": len(modes.driver.calls)},
        "timings": {
            "start_s": round(ready - began, 1),
            "faults_s": round(fault_end - ready, 1),
            "drain_s": round(drained - fault_end, 1),
            "total_s": round(time.monotonic() - began, 1),
            "cpu_s": round(cpu, 1),
        },
    }
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length (default 10)")
    parser.add_argument("--lease", type=float, default=3.0, help="lock_timeout in seconds")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the report as Markdown here")
    parser.add_argument("--run-dir", type=Path, help="keep the worker logs here")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated fault kinds (default: all)"
    )
    args = parser.parse_args(argv)
    kinds = tuple(kind for kind in args.faults.split(",") if kind)
    unknown = [kind for kind in kinds if kind not in FAULTS]
    if unknown or args.minutes <= 0:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULTS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    config = SoakConfig(
        minutes=args.minutes, lease=args.lease, seed=seed, run_dir=args.run_dir, kinds=kinds
    )
    command = "python -m benchmarks.soak " + shlex.join(
        [*(sys.argv[1:] if argv is None else argv), *([] if args.seed is not None else
                                                      ["--seed", str(seed)])]
    )  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every process
    try:
        report = run_soak(config, command)
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"soak: could not run: {exc}", file=sys.stderr)
        return 2
    text = markdown(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    print(text)
    if not report["passed"]:
        missed = [row["name"] for row in report["targets"] if row["safety"] and not row["met"]]
        print(f"soak: SAFETY TARGET MISSED: {'; '.join(missed)}", file=sys.stderr)
        return 1
    return 0

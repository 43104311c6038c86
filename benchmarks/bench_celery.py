"""Celery task benchmark: drain throughput of trivial locked tasks on a real worker.

Run ``python -m benchmarks.bench_celery [--quick] [--runs N] [--tasks 2000] [--seed N]``,
or, while working on the hot path, ``python -m benchmarks.bench_celery --hot-path --reps 3``:
the trivial-body drain ratios of plain, the floor, ours in run and queue scope,
celery-singleton and celery-once, and the profile figure of our own Python per task
(``benchmarks.profile_task``), nothing else; it prints how long it took.

Contenders (tasks of ``benchmarks.celery_app`` and ``celery_app_more``): a plain ``Task``;
the floor of a run-scope lock (issue 32: a plain task whose body takes ``SET NX PX`` and
releases with a Lua compare-and-delete, no integration); ``LockedTask`` in run scope and in
queue scope; celery-singleton's ``Singleton``; celery-once's ``QueueOnce``; ``LockedTask``
run scope with a 3 s lease, whose lease renewer reaches within the drain the steady state
that a long-running worker with the default 30 s lease reaches after 10 s; and plain, the
floor, ours and the two peers again with a 5 ms body.

Two private redis-servers on free loopback ports: the broker and the lock server (nothing
else touches it). For each run and contender:

1. the lock server is emptied and its ``INFO commandstats`` reset;
2. the producer (this process) publishes ``--tasks`` tasks with distinct arguments
   (``t.delay(i)``) while no worker runs: the publish rate, and the lock commands a
   publish costs, are measured alone;
3. a fresh ``celery worker`` (prefork, concurrency 2, default prefetch, no gossip, mingle
   or heartbeat, log level WARNING) is started on the full queue; drain time runs from the
   first task start (``task_prerun``) to the last task end (``task_postrun``, after every
   contender's lock release), as the pool processes record them in memory-mapped files
   (no round trip per task is added to what the locks are compared with);
4. the worker is stopped by its process group and the lock commands of the drain read.

Publishing before the worker starts keeps producer and worker from competing for CPU and
means the worker never waits for a slower producer (the lock-at-publish contenders publish
more slowly), so every contender's drain starts from the same full queue. One warm-up
worker first drains a few tasks of every contender (connections, scripts). Then each
repetition runs every contender once, in a fresh random order (``--seed``, printed);
every ratio between two contenders is paired: the median over repetitions of the ratio
within one repetition (a slow moment of a shared machine hits both sides of a ratio, or
neither). Every figure is compared with plain, the floor, celery-singleton and celery-once
(``REFERENCES``), each with the same body.

``INFO commandstats`` counts the commands a Lua script runs as well as the EVALSHA that
ran it, so it gives commands *including* in-script ones. Round trips (top-level commands)
are counted in a separate, untimed audit pass per contender under ``MONITOR``, which
labels script-internal commands ``lua``; ECHO markers split publish from drain. There,
connection setup (``HELLO``, ``CLIENT SETINFO``, health-check ``PING``, ``SCRIPT LOAD``) is
listed apart with its count, not divided by tasks.

Wall-clock rates on a shared machine are noisy, so CPU time is reported too: user + system
seconds from ``/proc`` of the worker's main process (from ``worker_ready`` on), its pool
processes (and, apart, their non-main threads, such as a lock renewer), both servers and
the producer, per task. On a small machine the worker's main process (consuming, acking,
feeding the pool) is the bottleneck, so drain rates understate what the locks cost in the
pool processes and servers; the CPU table shows it.

Results are printed as a markdown table (medians over runs); nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

from celery_singleton_lock.testing import (
    CeleryProcess,
    CeleryWorker,
    RedisServer,
    find_redis_server,
)

ROOT = Path(__file__).resolve().parents[1]
APP_MODULE = "benchmarks.celery_app_more"
Result = dict[str, Any]

#: (id, label) in table order; ids are keys of ``celery_app_more.TASKS``.
CONTENDERS: tuple[tuple[str, str], ...] = (
    ("plain", "plain `Task`"),
    ("floor", "floor: plain `Task`, body under `SET NX PX` + Lua compare-and-delete"),
    ("csl-run", "`LockedTask` run scope (ours)"),
    ("csl-queue", "`LockedTask` queue scope (ours)"),
    ("csl-run-3s", "`LockedTask` run scope, `lock_timeout=3` (ours, renewer in steady state)"),
    ("celery-singleton", "celery-singleton `Singleton`"),
    ("celery-once", "celery-once `QueueOnce`"),
    ("plain-5ms", "plain `Task`, 5 ms body"),
    ("floor-5ms", "floor, 5 ms body"),
    ("csl-run-5ms", "`LockedTask` run scope, 5 ms body (ours)"),
    ("csl-queue-5ms", "`LockedTask` queue scope, 5 ms body (ours)"),
    ("celery-singleton-5ms", "celery-singleton `Singleton`, 5 ms body"),
    ("celery-once-5ms", "celery-once `QueueOnce`, 5 ms body"),
)
#: Contenders with a 5 ms body: compared with the 5 ms-body references, drained with
#: ``slow_tasks`` tasks, left out of the MONITOR audit (their lock commands are those of
#: the trivial ones).
SLOW = frozenset(c for c, _ in CONTENDERS if c.endswith("-5ms"))
LABELS = dict(CONTENDERS)
#: What every Celery figure is compared with (issue 32), each with the same body as the
#: contender (``reference``).
REFERENCES: tuple[str, ...] = ("plain", "floor", "celery-singleton", "celery-once")
#: The references of lock CPU (theirs is 0 by definition).
PLAIN = frozenset({"plain", "plain-5ms"})
#: ``--hot-path``: the trivial-body contenders the hot path is judged against.
HOT_PATH: tuple[str, ...] = ("plain", "floor", "csl-run", "csl-queue", "celery-singleton",
                             "celery-once")  # fmt: skip
#: Commands our own admin connection sends; never counted.
OWN_COMMANDS = frozenset({"info", "config", "flushall", "echo"})
#: Per-connection (not per-task) commands: reported apart from per-task counts.
SETUP_COMMANDS = frozenset({"client", "hello", "auth", "select", "script", "ping"})
MARK = "csl-bench-mark:"


def now_ns() -> int:
    """System-wide monotonic clock, the one the tasks stamp with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass(frozen=True)
class Params:
    """Sizes and bounds for one invocation."""

    runs: int
    tasks: int
    warmup_tasks: int
    audit_tasks: int
    slow_tasks: int = 1000
    seed: int = 0
    concurrency: int = 2
    ready_timeout: float = 30.0
    stall_timeout: float = 20.0


# --- commandstats ------------------------------------------------------------------------


def command_calls(admin: redis.Redis) -> Counter[str]:
    """Calls per command (sub-commands as ``client|setinfo``) since the last
    ``CONFIG RESETSTAT``, minus our own admin commands; includes commands run by scripts."""
    calls: Counter[str] = Counter()
    for key, value in admin.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name.split("|", 1)[0] in OWN_COMMANDS:
            continue
        calls[name] = int(value["calls"]) + int(value.get("rejected_calls", 0))
    return calls


def per_task(calls: Counter[str], tasks: int) -> float:
    """Commands per task, every command counted (connection setup too: a handful per run)."""
    return sum(calls.values()) / tasks


# --- MONITOR audit -----------------------------------------------------------------------

_LINE = re.compile(rb'^\+?[\d.]+ \[\d+ ([^\]]+)\] "([^"]*)"(?: "([^"]*)")?')


class Monitor:
    """Counts commands on a server with ``MONITOR``: top-level vs in-script (``lua``), by
    phase; phases are switched by ``ECHO <MARK><phase>`` sent from the admin connection."""

    def __init__(self, port: int, ignore_addr: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.ignore_addr = ignore_addr
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (phase, where, command)
        self.phase = ""
        self.done = threading.Event()
        self.error: str | None = None
        self.sock.sendall(b"MONITOR\r\n")
        self._buffer = self._handshake()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()

    def _handshake(self, timeout: float = 5.0) -> bytes:
        """Wait for MONITOR's ``+OK``: only then are later commands sure to be seen."""
        buffer = b""
        deadline = time.monotonic() + timeout
        while b"\r\n" not in buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("MONITOR was not acknowledged")
            with contextlib.suppress(TimeoutError):
                buffer += self.sock.recv(1 << 16)
        reply, _, rest = buffer.partition(b"\r\n")
        if reply != b"+OK":
            raise RuntimeError(f"MONITOR refused: {reply!r}")
        return rest

    def _run(self) -> None:
        buffer = self._buffer
        try:
            while not self.done.is_set():
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    self.error = "MONITOR connection closed"
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\r\n")
                for line in lines:
                    self._line(line)
        except OSError as exc:
            self.error = f"MONITOR failed: {exc!r}"

    def _line(self, line: bytes) -> None:
        match = _LINE.match(line)
        if match is None:
            return
        client, command, first = (g.decode(errors="replace") if g else "" for g in match.groups())
        command = command.lower()
        if client == self.ignore_addr:
            if command == "echo" and first.startswith(MARK):
                self.phase = first.removeprefix(MARK)
                if self.phase == "end":
                    self.done.set()
            return
        if command in ("client", "script", "config", "command"):
            command = f"{command}|{first.lower()}"
        where = "lua" if client == "lua" else "top"
        self.counts[(self.phase or "before", where, command)] += 1

    def close(self, timeout: float = 10.0) -> None:
        """Wait (bounded) for the ``end`` marker, then close the connection."""
        self.done.wait(timeout)
        self.done.set()
        self._thread.join(timeout=2.0)
        self.sock.close()


# --- CPU accounting (Linux /proc) ------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (state first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of one process (all its threads); 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def side_thread_seconds(pid: int) -> float:
    """CPU seconds of the threads of ``pid`` other than its main thread (e.g. a renewer)."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            if task.name != str(pid):
                with contextlib.suppress(OSError, IndexError):
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / TICK
    return total


# --- one measurement -----------------------------------------------------------------------


@dataclass
class Bench:
    """The two servers, the producer app and the admin clients of one invocation."""

    broker: RedisServer
    lock: RedisServer
    tmp: Path
    params: Params
    app_module: ModuleType = field(init=False)
    lock_admin: redis.Redis = field(init=False)
    counter: int = 0

    def __post_init__(self) -> None:
        os.environ["CSL_BENCH_BROKER"] = self.broker.url
        os.environ["CSL_BENCH_LOCK"] = self.lock.url
        self.app_module = importlib.import_module(APP_MODULE)
        self.lock_admin = redis.Redis.from_url(self.lock.url, decode_responses=True)
        self.lock_admin.ping()

    def unavailable(self, contender: str) -> str | None:
        """Why a contender cannot run here, or None."""
        reason: str | None = self.app_module.UNAVAILABLE.get(contender)
        return reason

    def measure(self, contender: str, tasks: int, *, audit: bool = False) -> Result:
        """Publish ``tasks`` tasks of ``contender``, then drain them on a fresh worker."""
        self.counter += 1
        run_id = f"{self.counter}-{uuid.uuid4().hex[:6]}"
        app = self.app_module.app
        task = app.tasks[self.app_module.TASKS[contender]]
        self._ensure_empty_queue(app)
        self.lock_admin.flushall()
        self.lock_admin.config_resetstat()
        monitor = None
        if audit:
            monitor = Monitor(self.lock.port, str(self.lock_admin.client_info()["addr"]))
            self.lock_admin.echo(MARK + "publish")

        ids: set[str] = set()
        servers_before = self._server_cpu()
        cpu_before = time.process_time()
        started = now_ns()
        try:
            for i in range(tasks):
                ids.add(task.delay(i).id)
        except Exception as exc:
            if monitor:
                monitor.close(0)
            return {"status": f"publish failed: {exc!r}"}
        publish_s = (now_ns() - started) / 1e9
        producer_cpu = time.process_time() - cpu_before
        servers_published = self._server_cpu()
        publish_calls = command_calls(self.lock_admin)
        if monitor:
            self.lock_admin.echo(MARK + "drain")

        result = self._drain(run_id, tasks)
        drain_calls = command_calls(self.lock_admin) - publish_calls
        if monitor:
            self.lock_admin.echo(MARK + "end")
            monitor.close()
            result["audit"] = audit_summary(monitor, tasks)
        us = 1e6 / tasks
        if result["status"] == "ok":
            broker_cpu, lock_cpu = (
                b - a for a, b in zip(servers_published, result.pop("servers_drained"), strict=True)
            )
            result["cpu_us"] = {
                "producer": producer_cpu * us,
                "broker_publish": (servers_published[0] - servers_before[0]) * us,
                "lock_publish": (servers_published[1] - servers_before[1]) * us,
                "children": result.pop("children_cpu") * us,
                "side_threads": result.pop("side_threads_cpu") * us,
                "parent": result.pop("parent_cpu") * us,
                "broker": broker_cpu * us,
                "lock": lock_cpu * us,
            }
        result.update(
            publish_rate=tasks / publish_s,
            distinct_ids=len(ids),
            publish_cmds=per_task(publish_calls, tasks),
            drain_cmds=per_task(drain_calls, tasks),
            commands=dict(publish_calls + drain_calls),
        )
        if result["status"] == "ok" and len(ids) != tasks:
            result["status"] = f"only {len(ids)} distinct task ids for {tasks} publishes"
        return result

    def warm_up(self, contenders: Sequence[str]) -> Result:
        """Publish ``warmup_tasks`` tasks of each contender, then drain them all on one
        worker: the producer's connections exist and the lock server has loaded every
        script before the first measurement."""
        self.counter += 1
        app = self.app_module.app
        self._ensure_empty_queue(app)
        self.lock_admin.flushall()
        try:
            for contender in contenders:
                task = app.tasks[self.app_module.TASKS[contender]]
                for i in range(self.params.warmup_tasks):
                    task.delay(i)
        except Exception as exc:
            return {"status": f"publish failed: {exc!r}"}
        run_id = f"{self.counter}-warm-{uuid.uuid4().hex[:6]}"
        return self._drain(run_id, self.params.warmup_tasks * len(contenders))

    def _drain(self, run_id: str, tasks: int) -> Result:
        """Start a worker on the full queue, wait (bounded) for every task, stop it."""
        log = self.tmp / f"worker-{run_id}.log"
        progress = self.tmp / f"progress-{run_id}"
        progress.mkdir()
        env = {
            "CSL_BENCH_PROGRESS": str(progress),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        # Prefork, concurrency 2, no gossip, mingle or heartbeat; WARNING logs no " ready.":
        # readiness is the progress directory's "ready" file (the worker_ready signal).
        worker = CeleryWorker(
            APP_MODULE, pool="prefork", concurrency=self.params.concurrency,
            hostname=f"bench-{run_id}@%h", loglevel="WARNING", env=env, cwd=ROOT, log_path=log,
        ).start(wait=False)  # fmt: skip
        cpu: Result = {}
        try:
            status = self._wait(worker, progress, tasks)
            if status == "ok":  # CPU used by the drain, read before the processes go
                ready_cpu = float((progress / "ready").read_text() or 0)
                cpu["parent_cpu"] = cpu_seconds(worker.pid) - ready_cpu
                pool = worker.children()
                cpu["children_cpu"] = sum(cpu_seconds(pid) for pid in pool)
                cpu["side_threads_cpu"] = sum(side_thread_seconds(pid) for pid in pool)
                cpu["servers_drained"] = self._server_cpu()
        finally:
            worker.stop(group=True)
        # The slots outlive the pool processes: read the final values once they are gone.
        starts, ended, end, odd = self.app_module.read_progress(progress)
        if status == "ok" and (odd or ended != tasks):
            status = f"{ended} tasks ended, {odd} of them failed or skipped their body"
        result: Result = {"status": status}
        if status != "ok":
            result["log_tail"] = worker.log()[-3000:]
            return result
        drain_s = (end - min(starts)) / 1e9
        result.update(drain_s=drain_s, drain_rate=tasks / drain_s, processes=len(starts), **cpu)
        return result

    def _server_cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the broker and the lock server."""
        return cpu_seconds(self.broker.pid), cpu_seconds(self.lock.pid)

    def _wait(self, worker: CeleryProcess, progress: Path, tasks: int) -> str:
        """Poll the progress slots until every task ended; bounded by start and stall limits."""
        read = self.app_module.read_progress
        deadline = time.monotonic() + self.params.ready_timeout
        while not (progress / "ready").exists():
            if not worker.alive():
                return "worker exited at start"
            if time.monotonic() > deadline:
                return f"worker not ready within {self.params.ready_timeout:.0f} s"
            time.sleep(0.05)
        last, last_change = -1, time.monotonic()
        while True:
            ended = read(progress)[1]
            if ended >= tasks:
                return "ok"
            if ended != last:
                last, last_change = ended, time.monotonic()
            elif time.monotonic() - last_change > self.params.stall_timeout:
                return f"stalled at {ended}/{tasks} tasks for {self.params.stall_timeout:.0f} s"
            if not worker.alive():
                return f"worker exited after {ended}/{tasks} tasks"
            time.sleep(0.05)

    def _ensure_empty_queue(self, app: Any) -> None:
        """A failed earlier run may leave messages behind: purge them (never the bindings)."""
        broker = redis.Redis.from_url(self.broker.url)
        try:
            if broker.llen("celery") or broker.exists("unacked"):
                app.control.purge()
                broker.delete("unacked", "unacked_index")
        finally:
            broker.close()


def audit_summary(monitor: Monitor, tasks: int) -> Result:
    """Per-task top-level and in-script commands by phase, from a MONITOR count."""
    if monitor.error:
        return {"error": monitor.error}
    per: dict[str, float] = {}
    breakdown: dict[str, float] = {}
    setup: Counter[str] = Counter()
    for (phase, where, command), count in monitor.counts.items():
        if command.split("|", 1)[0] in SETUP_COMMANDS:
            setup[f"{phase}:{command}"] += count
            continue
        per[f"{phase}_{where}"] = per.get(f"{phase}_{where}", 0.0) + count / tasks
        breakdown[f"{phase} {where} {command}"] = count / tasks
    return {
        "publish_rt": per.get("publish_top", 0.0),
        "drain_rt": per.get("drain_top", 0.0),
        "publish_lua": per.get("publish_lua", 0.0),
        "drain_lua": per.get("drain_lua", 0.0),
        "breakdown": dict(sorted(breakdown.items())),
        "setup": dict(sorted(setup.items())),
        "phases_seen": sorted({phase for phase, _, _ in monitor.counts}),
    }


# --- reporting -----------------------------------------------------------------------------


def run_command(argv: list[str]) -> str:
    """First line of a command's output, or a short error."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": run_command(["nproc"]),
        "cpu": cpu or platform.processor() or "?",
        "os": platform.platform(),
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "billiard": version("billiard"),
        "redis-py": version("redis"),
        "redis-server": run_command([find_redis_server() or "redis-server", "--version"]),
        "celery-singleton-lock": version("celery-singleton-lock"),
        "celery-singleton": version("celery-singleton"),
        "celery-once": version("celery-once"),
    }


def busy_cpu() -> tuple[float, float]:
    """(CPU seconds all processes of the host have used, of which this process and its
    reaped children), from /proc/stat and os.times(); their difference over an interval is
    what other processes used: the check that the machine was quiet."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system . . irq softirq steal
    own = os.times()
    return busy / tick, own.user + own.system + own.children_user + own.children_system


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


DRAIN_PARTS = ("children", "parent", "broker", "lock")


def drain_cpu(result: Result) -> float:
    """CPU microseconds per task of the drain: worker processes and both servers."""
    return float(sum(result["cpu_us"][part] for part in DRAIN_PARTS))


def per_main(result: Result) -> float:
    """CPU of the pool processes plus the lock server per unit of the worker main process's
    CPU. The main process does the same work for every contender (consume, ack, feed the
    pool), so this ratio cancels the machine's speed, which drifts on a shared host."""
    cpu = result["cpu_us"]
    return float((cpu["children"] + cpu["lock"]) / cpu["parent"]) if cpu["parent"] else 0.0


#: CPU that counts as "lock CPU" when a plain task's is subtracted (issue 24): the producer
#: and the lock server at publish, the worker's processes and the lock server at drain.
TOTAL_PARTS = ("producer", "lock_publish", "children", "parent", "lock")


def total_cpu(result: Result) -> float:
    """Producer + worker processes + lock server CPU µs per task (the broker left out)."""
    return float(sum(result["cpu_us"][part] for part in TOTAL_PARTS))


def reference(kind: str, contender: str) -> str:
    """The reference ``kind`` (one of ``REFERENCES``) with the same body as ``contender``."""
    return f"{kind}-5ms" if contender in SLOW else kind


def paired(
    mine: Sequence[Result], theirs: Sequence[Result], value: Callable[[Result], float]
) -> list[float]:
    """Per-repetition ratios ``value(mine) / value(theirs)`` of the repetitions where both
    ran ok (matched by ``run``), in repetition order; a zero or NaN denominator is left
    out."""
    by_run = {r["run"]: r for r in theirs if r.get("status") == "ok"}
    ratios = []
    for r in sorted(mine, key=lambda r: int(r.get("run", 0))):
        other = by_run.get(r.get("run"))
        if r.get("status") != "ok" or other is None:
            continue
        a, b = value(r), value(other)
        if b and not math.isnan(a) and not math.isnan(b):
            ratios.append(a / b)
    return ratios


def summarise(results: dict[str, list[Result]], audits: dict[str, Result]) -> dict[str, Result]:
    """Medians per contender, and every ratio between two contenders paired: the median
    over repetitions of the ratio within one repetition. ``ratio`` is the drain rate against
    plain, ``x`` against each of ``REFERENCES`` (same body). ``lock_cpu_us``: the median of
    per-repetition total CPU (``TOTAL_PARTS``) per task minus plain's in that repetition;
    ``lock_cpu_x_once`` the median of per-repetition lock CPU against celery-once's."""
    summary: dict[str, Result] = {}

    def ok_runs(name: str) -> list[Result]:
        return [r for r in results.get(name, []) if r["status"] == "ok"]

    def drain_rate(r: Result) -> float:
        return float(r["drain_rate"])

    def lock_cpu(runs: Sequence[Result], plain: Sequence[Result]) -> dict[int, float]:
        """Per repetition: total CPU per task minus plain's in the same repetition."""
        base = {r["run"]: total_cpu(r) for r in plain if r["status"] == "ok"}
        return {r["run"]: total_cpu(r) - base[r["run"]] for r in runs
                if r["status"] == "ok" and r["run"] in base}  # fmt: skip

    for contender, runs in results.items():
        plain = results.get(reference("plain", contender), [])
        once = results.get(reference("celery-once", contender), [])
        ok = ok_runs(contender)
        failed = [r["status"] for r in runs if r["status"] != "ok"]
        if not ok:
            summary[contender] = {"status": failed[0] if failed else "not run"}
            continue
        ratios = paired(ok, plain, drain_rate)
        mine_lock, once_lock = lock_cpu(ok, plain), lock_cpu(once, plain)
        x_once = [mine_lock[run] / once_lock[run] for run in sorted(mine_lock)
                  if once_lock.get(run, 0.0) > 0 and contender not in PLAIN]  # fmt: skip
        summary[contender] = {
            "status": "ok",
            "runs_ok": len(ok),
            "runs_failed": failed,
            "drain_rate": median([r["drain_rate"] for r in ok]),
            "drain_min": min(r["drain_rate"] for r in ok),
            "drain_max": max(r["drain_rate"] for r in ok),
            "ratio": median(ratios),
            "ratios": ratios,
            "x": {
                kind: median(paired(ok, results.get(reference(kind, contender), []), drain_rate))
                for kind in REFERENCES
            },
            "publish_rate": median([r["publish_rate"] for r in ok]),
            "cmds": median([r["publish_cmds"] + r["drain_cmds"] for r in ok]),
            "publish_cmds": median([r["publish_cmds"] for r in ok]),
            "drain_cmds": median([r["drain_cmds"] for r in ok]),
            "cpu_us": {part: median([r["cpu_us"][part] for r in ok]) for part in ok[0]["cpu_us"]},
            "cpu_ratio": median(paired(ok, plain, drain_cpu)),
            "total_cpu_us": median([total_cpu(r) for r in ok]),
            "lock_cpu_us": median(list(mine_lock.values())),
            "lock_cpu_x_once": median(x_once),
            "per_main": median([per_main(r) for r in ok]),
            "audit": audits.get(contender),
        }
    return summary


def fmt_rt(audit: Result | None) -> str:
    if not audit:
        return "not audited"
    if "error" in audit:
        return f"audit failed: {audit['error']}"
    total = audit["publish_rt"] + audit["drain_rt"]
    return f"{total:.2f} ({audit['publish_rt']:.2f} + {audit['drain_rt']:.2f})"


def times(value: float) -> str:
    """A ratio as ``0.87×``; NaN as an em dash."""
    return "—" if math.isnan(value) else f"{value:.2f}×"


def num(value: float, digits: int = 2) -> str:
    """A figure with thousands separators; NaN as an em dash."""
    return "—" if math.isnan(value) else f"{value:,.{digits}f}"


def table(summary: dict[str, Result], contenders: Sequence[str]) -> str:
    """The markdown result table: drain rates, and the paired drain ratios to each of
    ``REFERENCES`` (the 5 ms-body rows to the 5 ms-body references)."""
    lines = [
        "| contender | drain tasks/s (median) | drain min–max "
        + "".join(f"| × {kind} " for kind in REFERENCES)
        + "| publish tasks/s | lock round trips/task (publish + worker) "
        "| lock commands/task incl. in-script |",
        "|---|---:|---:|" + "---:|" * len(REFERENCES) + "---:|---:|---:|",
    ]
    for contender in contenders:
        row = summary.get(contender, {"status": "not run"})
        label = LABELS[contender]
        if row["status"] != "ok":
            lines.append(f"| {label} | N/A: {row['status']} |" + " – |" * (len(REFERENCES) + 4))
            continue
        ratios = "".join(
            "| 1.00 " if reference(kind, contender) == contender else f"| {times(row['x'][kind])} "
            for kind in REFERENCES
        )
        cmds = f"{row['cmds']:.2f} ({row['publish_cmds']:.2f} + {row['drain_cmds']:.2f})"
        lines.append(
            f"| {label} | {row['drain_rate']:,.0f} "
            f"| {row['drain_min']:,.0f}–{row['drain_max']:,.0f} {ratios}"
            f"| {row['publish_rate']:,.0f} | {fmt_rt(row['audit'])} | {cmds} |"
        )
    return "\n".join(lines)


def cpu_table(summary: dict[str, Result], contenders: Sequence[str]) -> str:
    """Where the CPU goes, in microseconds per task (medians)."""
    lines = [
        "| contender | pool processes (of which side threads) | worker main process "
        "| broker server | lock server | drain total (ratio to plain) "
        "| (pool + lock server) ÷ main process | producer publish | lock server at publish "
        "| producer + worker + lock server | lock CPU (that − plain's) "
        "| lock CPU × celery-once's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for contender in contenders:
        row = summary.get(contender, {"status": "not run"})
        if row["status"] != "ok":
            continue
        cpu = row["cpu_us"]
        total = sum(cpu[part] for part in DRAIN_PARTS)
        lines.append(
            f"| {LABELS[contender]} | {cpu['children']:.0f} ({cpu['side_threads']:.0f}) "
            f"| {cpu['parent']:.0f} "
            f"| {cpu['broker']:.0f} | {cpu['lock']:.0f} | {total:.0f} ({times(row['cpu_ratio'])}) "
            f"| {row['per_main']:.2f} "
            f"| {cpu['producer']:.0f} | {cpu['lock_publish']:.0f} "
            f"| {row['total_cpu_us']:.0f} | {num(row['lock_cpu_us'], 0)} "
            f"| {times(row['lock_cpu_x_once'])} |"
        )
    return "\n".join(lines)


def breakdown_text(summary: dict[str, Result], contenders: Sequence[str]) -> str:
    """Where each contender's lock commands come from (MONITOR audit, per task)."""
    out = []
    for contender in contenders:
        audit = (summary.get(contender) or {}).get("audit")
        if not audit or "error" in audit:
            continue
        parts = ", ".join(f"{k} {v:.2f}" for k, v in audit["breakdown"].items() if v >= 0.005)
        setup = ", ".join(f"{k} ×{v}" for k, v in audit["setup"].items())
        out.append(f"- {LABELS[contender]}: {parts or 'no lock commands'}")
        if setup:
            out.append(f"  (per connection, not per task: {setup})")
    return "\n".join(out)


# --- main ----------------------------------------------------------------------------------


@contextlib.contextmanager
def servers() -> Iterator[tuple[RedisServer, RedisServer]]:
    """The broker and the lock server, both private and stopped by PID on exit."""
    with RedisServer() as broker, RedisServer() as lock:
        yield broker, lock


def raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def build_params(
    quick: bool,
    runs: int | None = None,
    tasks: int | None = None,
    audit_tasks: int | None = None,
    seed: int | None = None,
) -> Params:
    """Full or ``--quick`` sizes, with any explicit override; a fresh seed unless given."""
    tasks = tasks or (300 if quick else 2000)
    if audit_tasks is None:
        audit_tasks = 100 if quick else 500
    return Params(
        runs=runs or (1 if quick else 3),
        tasks=tasks,
        slow_tasks=max(100, tasks // 2),
        warmup_tasks=20,
        audit_tasks=min(tasks, audit_tasks),
        seed=random.SystemRandom().randrange(1 << 31) if seed is None else seed,
    )


def run_celery(
    params: Params, chosen: Sequence[str], log: Any = print
) -> tuple[dict[str, list[Result]], dict[str, Result], dict[str, Result]]:
    """Measure the ``chosen`` contenders: (per-run results, audits, summary). ``log``
    receives one progress line per measurement."""
    results: dict[str, list[Result]] = {c: [] for c in chosen}
    audits: dict[str, Result] = {}
    with servers() as (broker, lock), tempfile.TemporaryDirectory(prefix="csl-bench-") as tmp:
        bench = Bench(broker, lock, Path(tmp), params)
        live = []
        for contender in chosen:
            reason = bench.unavailable(contender)
            if reason:
                results[contender].append({"status": reason, "run": 0})
                log(f"{contender}: N/A ({reason})")
            else:
                live.append(contender)
        # Warm-up: the producer's broker and lock connections, script loading on the servers;
        # all contenders on one worker, or, if that fails, one by one to find the culprit.
        warm = bench.warm_up(live) if live else {"status": "ok"}
        if warm["status"] != "ok":
            log(f"warm-up of every contender at once: {warm['status']}; now one by one")
            for contender in list(live):
                outcome = bench.measure(contender, params.warmup_tasks)
                if outcome["status"] != "ok":
                    results[contender].append({"status": f"warm-up: {outcome['status']}", "run": 0})
                    log(f"warm-up {contender}: {outcome['status']}")
                    log(outcome.get("log_tail", ""))
                    live.remove(contender)
        rng = random.Random(params.seed)
        for run in range(params.runs):
            order = rng.sample(live, len(live))  # a fresh random order per repetition
            for contender in order:
                tasks = params.slow_tasks if contender in SLOW else params.tasks
                outcome = bench.measure(contender, tasks)
                outcome["run"] = run
                outcome["load1"] = os.getloadavg()[0]
                results[contender].append(outcome)
                if outcome["status"] == "ok":
                    log(
                        f"run {run + 1} {contender:17} drain {outcome['drain_rate']:7,.0f}/s "
                        f"({outcome['drain_s']:.2f} s)  publish {outcome['publish_rate']:7,.0f}/s"
                        f"  lock cmds/task {outcome['publish_cmds']:.2f} + "
                        f"{outcome['drain_cmds']:.2f}  drain CPU {drain_cpu(outcome):.0f} us/task"
                        f"  load {loadavg()}"
                    )
                else:
                    log(f"run {run + 1} {contender}: {outcome['status']}")
                    if outcome.get("log_tail"):
                        log(outcome["log_tail"])
        if params.audit_tasks:
            for contender in (c for c in live if c not in SLOW):
                outcome = bench.measure(contender, params.audit_tasks, audit=True)
                if outcome["status"] == "ok" and "audit" in outcome:
                    audits[contender] = outcome["audit"]
                else:
                    audits[contender] = {"error": outcome["status"]}
    return results, audits, summarise(results, audits)


CPU_NOTE = (
    "CPU per task in µs (user + system from /proc, medians; the drain total is the worker's "
    "processes plus both servers, its ratio to plain paired per repetition; the ÷ main "
    "process column is "
    "the median of per-run ratios of pool-process plus lock-server CPU to the worker main "
    "process's CPU, which is the same Celery work for every contender and so cancels the "
    "host's drifting speed; producer + worker + lock server is the producer's publish CPU, "
    "the lock server's at publish and at drain and the worker's processes, the broker left "
    "out; lock CPU is that total minus the plain task's in the same repetition (median), "
    "issue 24's \"lock CPU per task\", and its ratio to celery-once's the median of "
    "per-repetition ratios, issue 32's; the 5 ms-body rows against plain and celery-once "
    "with a 5 ms body):"
)


def render_tables(summary: dict[str, Result], chosen: Sequence[str], above: str = "") -> str:
    """The drain table, the CPU table and the command breakdown, as markdown."""
    lead = [above, ""] if above else []
    return "\n".join(
        [
            *lead,
            table(summary, chosen),
            "",
            CPU_NOTE,
            "",
            *lead,
            cpu_table(summary, chosen),
            "",
            "Lock commands per task by phase, where and command (MONITOR audit):",
            "",
            breakdown_text(summary, chosen),
        ]
    )


def targets(summary: dict[str, Result]) -> list[str]:
    """Issue 13's Celery targets, each marked met / MISSED / not measured."""
    nan = float("nan")

    def row(contender: str) -> Result:
        return summary.get(contender) or {}

    def ok(contender: str) -> bool:
        return row(contender).get("status") == "ok"

    def audit(contender: str, field: str) -> float:
        found = row(contender).get("audit") or {}
        value = found.get(field)
        return float(value) if isinstance(value, int | float) else nan

    def line(text: str, values: Sequence[float], good: bool) -> str:
        measured = bool(values) and not any(math.isnan(v) for v in values)
        return f"- {text} -> {('met' if good else 'MISSED') if measured else 'not measured'}"

    out = []
    for contender, scope in (("csl-run", "run"), ("csl-queue", "queue")):
        ratio = row(contender)["ratio"] if ok(contender) else nan
        rt = audit(contender, "drain_rt")
        out.append(
            line(
                f"Celery. drain, {scope} scope >= 0.95x plain: {num(ratio)}x "
                f"({num(row(contender).get('drain_rate', nan), 0)} vs "
                f"{num(row('plain').get('drain_rate', nan), 0)} tasks/s, median of per-run ratios)",
                [ratio],
                ratio >= 0.95,
            )
        )
        out.append(
            line(
                f"Celery. {scope} scope: <= 2 lock round trips per task in the worker: {num(rt)}",
                [rt],
                rt <= 2,
            )
        )

    def publish(contender: str) -> tuple[float, float, float, float]:
        cpu = row(contender).get("cpu_us", {}).get("producer", nan) if ok(contender) else nan
        rate = row(contender).get("publish_rate", nan) if ok(contender) else nan
        cmds = row(contender).get("publish_cmds", nan) if ok(contender) else nan
        return cpu, audit(contender, "publish_rt"), rate, cmds

    q_cpu, q_rt, q_rate, q_cmds = publish("csl-queue")
    s_cpu, s_rt, s_rate, s_cmds = publish("celery-singleton")
    out.append(
        line(
            "Celery. queue-scope publish cost <= celery-singleton's (producer CPU and lock "
            f"round trips per publish): {num(q_cpu, 0)} vs {num(s_cpu, 0)} µs CPU, "
            f"{num(q_rt)} vs {num(s_rt)} round trips (also: {num(q_rate, 0)} vs "
            f"{num(s_rate, 0)} publishes/s, {num(q_cmds)} vs {num(s_cmds)} lock commands "
            "incl. in-script)",
            [q_cpu, s_cpu, q_rt, s_rt],
            q_cpu <= s_cpu and q_rt <= s_rt,
        )
    )
    return out


def run_module(module: str, args: Sequence[str], timeout: float) -> Result:
    """``python -m module *args --json <tmp>`` in a fresh process (a benchmark app reads its
    servers' URLs once per process); its JSON, or ``{"status": <why not>}``."""
    with tempfile.TemporaryDirectory(prefix="csl-run-") as tmp:
        out = Path(tmp) / "result.json"
        try:
            done = subprocess.run([sys.executable, "-m", module, *args, "--json", str(out)],
                                  cwd=ROOT, timeout=timeout, check=False,
                                  stdout=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"status": f"timed out after {timeout:.0f} s"}
        if done.returncode or not out.exists():
            return {"status": f"{module} exited with {done.returncode}"}
        result: Result = json.loads(out.read_text(encoding="utf-8"))
        return result


#: Tasks ``--hot-path`` profiles (ours, run scope: default options): a short cProfile
#: drain for the calls per task, a longer one under the CPU-time sampler.
HOT_PATH_PROFILE_TASKS = (300, 4000)


def hot_path_report(
    summary: dict[str, Result], profile: dict[str, Result], params: Params
) -> list[str]:
    """What ``--hot-path`` prints: the paired drain ratios of ``HOT_PATH``, the drain rows
    of issue 32's targets, and the profile figure of our own Python per task."""
    from benchmarks import targets32  # noqa: PLC0415  (targets32 is for reporting only)

    lines = [
        f"Trivial bodies, {params.runs} repetition(s) x {params.tasks} tasks, order seed "
        f"{params.seed}; each ratio is the median of per-repetition ratios:",
        "",
        "| contender | drain tasks/s | × plain | × floor | × celery-singleton | × celery-once "
        "| × plain per repetition |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for contender in HOT_PATH:
        row = summary.get(contender) or {"status": "not run"}
        if row["status"] != "ok":
            lines.append(f"| {contender} | N/A: {row['status']} | | | | | |")
            continue
        cells = " | ".join(times(row["x"][kind]) for kind in REFERENCES)
        each = ", ".join(f"{r:.2f}" for r in row["ratios"])
        lines.append(f"| {contender} | {row['drain_rate']:,.0f} | {cells} | {each} |")
    lines += ["", "Issue 32's drain targets:", ""]
    lines += [f"- {r.label}: {r.measured} (target {r.target}) -> {r.verdict}"
              for r in targets32.drain_rows(summary)]  # fmt: skip
    run = profile.get("csl-run") or {}
    found = run.get("sampled") or {}
    if found.get("status") == "ok":
        lines += [
            "",
            f"Our own Python per task in the pool, run scope, default options (CPU in "
            f"celery_singleton_lock's functions, sampled over {found['tasks_sampled']} tasks): "
            f"{found['ours_cpu_us']:.0f} ± {found['ours_cpu_err_us']:.0f} µs (target <= 100) "
            f"of {found['pool_cpu_us']:.0f} µs in the pool process "
            f"({100 * found['ours_cpu_us'] / found['pool_cpu_us']:.0f} %: the share moves less "
            "with the machine's load than the µs); cProfile: "
            f"{num(float(run.get('ours_calls', math.nan)), 1)} calls into our functions per "
            f"task, their own time {num(float(run.get('ours_self_us', math.nan)), 0)} µs "
            "(target <= 100; inflated by a cost per call and by waits for a CPU). Where it "
            "goes: python -m benchmarks.profile_task --kinds csl-run",
        ]
    elif profile:
        lines += ["", f"Profile: {found.get('status') or run.get('status') or profile}"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_celery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a < 90 s smoke check (1 run)")
    parser.add_argument(
        "--hot-path",
        action="store_true",
        help="only the trivial-body drain of plain, floor, ours (run, queue), celery-singleton "
        "and celery-once, no audit, then the profile figure of our own Python (~3 min)",
    )
    parser.add_argument(
        "--runs", "--reps", dest="runs", type=int,
        help="repetitions: every contender once each (default 3, quick 1)",
    )  # fmt: skip
    parser.add_argument("--tasks", type=int, help="tasks per run (default 2000, quick 300)")
    parser.add_argument(
        "--audit-tasks",
        type=int,
        help="tasks of the MONITOR audit (default 500, quick 100, --hot-path 0; 0: no audit)",
    )
    parser.add_argument(
        "--contenders",
        help="comma-separated subset of: " + ",".join(c for c, _ in CONTENDERS),
    )
    parser.add_argument("--seed", type=int, help="seed of the contenders' order (default: fresh)")
    parser.add_argument(
        "--no-profile", action="store_true", help="--hot-path without the profile figure"
    )
    parser.add_argument("--json", metavar="PATH", help="also write raw results as JSON")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the worker and both servers are still stopped.
    signal.signal(signal.SIGTERM, raise_exit)
    audit_tasks = args.audit_tasks
    if args.hot_path and audit_tasks is None:
        audit_tasks = 0
    params = build_params(args.quick, args.runs, args.tasks, audit_tasks, args.seed)
    try:
        chosen = choose(",".join(HOT_PATH) if args.hot_path else args.contenders)
    except ValueError as exc:
        parser.error(str(exc))

    command = "python -m benchmarks.bench_celery " + shlex.join(sys.argv[1:] if argv is None
                                                                 else list(argv))  # fmt: skip
    info = machine_info()
    print(f"# Celery task benchmark\n\ncommand: `{command.strip()}`")
    for key, value in info.items():
        print(f"- {key}: {value}")
    print(f"- load average at start: {loadavg()}")
    print(
        f"- {params.runs} run(s) x {params.tasks} tasks per contender, order seed "
        f"{params.seed}; worker: prefork, concurrency {params.concurrency}, default prefetch; "
        f"audit: {params.audit_tasks} tasks\n"
    )
    began = time.monotonic()
    cpu_start = busy_cpu()
    results, audits, summary = run_celery(params, chosen, lambda text: print(text, flush=True))
    profile: dict[str, Result] = {}
    if args.hot_path:
        if not args.no_profile:
            print("profile of ours, run scope (benchmarks.profile_task) ...", flush=True)
            cprofiled, sampled = HOT_PATH_PROFILE_TASKS
            profile = run_module(
                "benchmarks.profile_task",
                ["--kinds", "csl-run", "--tasks", str(cprofiled), "--sample-tasks", str(sampled)],
                300,
            )
        print("\n" + "\n".join(hot_path_report(summary, profile, params)))
    else:
        print(f"\n{render_tables(summary, chosen)}\n")
        print("\n".join(targets(summary)))
    took = time.monotonic() - began
    cpu_end = busy_cpu()
    foreign = max(0.0, (cpu_end[0] - cpu_start[0]) - (cpu_end[1] - cpu_start[1]))
    capacity = took * len(os.sched_getaffinity(0))
    print(
        f"\nload average at end: {loadavg()}; took {took:.0f} s; CPU used by other processes "
        f"meanwhile: {foreign:.0f} s of {capacity:.0f} CPU-seconds ({100 * foreign / capacity:.0f} "
        "%: what other work took from this run's machine)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": info, "params": params.__dict__, "results": results,
                 "audits": audits, "summary": summary, "profile": profile},
                indent=2, default=str,
            )
        )  # fmt: skip
    return 0


def choose(wanted: str | None) -> list[str]:
    """The contenders to run, in table order, plain always among them (every ratio needs
    it); ValueError for an unknown name."""
    chosen = [c for c, _ in CONTENDERS]
    if wanted:
        names = [c.strip() for c in wanted.split(",") if c.strip()]
        unknown = sorted(set(names) - set(chosen))
        if unknown:
            raise ValueError(f"unknown contenders: {', '.join(unknown)}")
        chosen = [c for c in chosen if c in names]
    if "plain" not in chosen:
        chosen.insert(0, "plain")
    return chosen


if __name__ == "__main__":
    sys.exit(main())

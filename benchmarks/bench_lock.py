"""Lock-engine benchmark: our ``RedisLock`` side by side with other Redis locks.

Run ``python -m benchmarks.bench_lock [--quick] [--runs N] [--json out.json]``.

Scenarios (each contender, each run, gets its own private ``redis-server`` on a free
loopback port, started and stopped here):

A. uncontended acquire+release pairs on one client;
B. the flash-sale test: 10 processes x 10 threads, one connection each, 1000 non-atomic
   read-increment-write critical sections on one lock;
C. hand-off latency from the holder's release to a blocked waiter's acquire;
D. a holder SIGKILLed mid-lease: how long after the lease expired a blocked waiter gets in.

Results are printed as markdown tables (medians over runs); nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import redis

from benchmarks.contenders import CONTENDERS, Contender, make_client
from celery_singleton_lock.testing import RedisServer, find_redis_server

Result = dict[str, Any]
CTX = mp.get_context("fork")  # children inherit the contender table; Linux only, like the server


def now_ns() -> int:
    """System-wide monotonic clock, comparable across processes on one host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def server_time_us(client: redis.Redis) -> int:
    """The Redis server clock (``TIME``) in microseconds."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


OWN_COMMANDS = ("info", "config")


def server_cpu_us(admin: redis.Redis) -> float:
    """CPU time the redis-server main thread has used so far (user + sys), in µs."""
    cpu = admin.info("cpu")
    return (float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])) * 1e6


def command_calls(admin: redis.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT``, minus our own INFO/CONFIG.

    ``INFO commandstats`` also counts commands executed inside Lua scripts.
    """
    stats = admin.info("commandstats")
    calls: dict[str, int] = {}
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        if name.split("|", 1)[0] in OWN_COMMANDS:
            continue
        calls[name] = int(value["calls"])
    return calls


class CountingConnection(redis.Connection):
    """A connection that counts network writes: one per command, one per pipeline.

    With request/response traffic every write is followed by waiting for its reply, so
    writes are round trips.
    """

    writes = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Params:
    """Iteration counts and bounds for one invocation."""

    runs: int
    a_pairs: int
    a_warmup: int
    b_procs: int
    b_threads: int
    b_per_thread: int
    b_lease: float
    b_budget: float
    c_samples: int
    c_warmup: int
    c_budget: float
    d_samples: int
    d_lease: float

    @classmethod
    def build(cls, quick: bool, runs: int | None) -> Params:
        """Full or ``--quick`` settings."""
        if quick:
            return cls(runs or 1, 300, 50, 10, 10, 2, 10.0, 60.0, 20, 2, 30.0, 2, 1.0)
        return cls(runs or 3, 2000, 200, 10, 10, 10, 10.0, 120.0, 200, 5, 150.0, 7, 1.0)


# --- A: uncontended pairs -------------------------------------------------------------


class _PairTimer:
    """One contender of scenario A: its own server, counting client and accumulated samples."""

    def __init__(self, contender: Contender, server: RedisServer, run: int) -> None:
        self.name = contender.name
        pool = redis.ConnectionPool.from_url(server.url, connection_class=CountingConnection)
        self.client = redis.Redis(connection_pool=pool, single_connection_client=True)
        self.admin = redis.Redis.from_url(server.url)
        self.handle = contender.factory(self.client, f"bench:a:{run}", 30.0)
        self.samples: list[int] = []
        self.blocks: list[float] = []  # median ns of each timed block, in round order
        self.writes = 0
        self.cpu_ns = 0  # this thread's CPU time in timed blocks: the client-side cost
        self.server_cpu_us = 0.0  # server CPU during the timed phase (set by the caller)
        self.status = "ok"

    def pairs(self, count: int, timed: bool) -> None:
        """Run ``count`` acquire+release pairs, recording them when ``timed``."""
        if self.status != "ok":
            return
        try:
            before = CountingConnection.writes
            first = len(self.samples)
            cpu = time.thread_time_ns()
            for _ in range(count):
                t0 = now_ns()
                if not self.handle.acquire(5.0):
                    self.status = "uncontended acquire returned False"
                    return
                self.handle.release()
                if timed:
                    self.samples.append(now_ns() - t0)
            if timed:
                self.cpu_ns += time.thread_time_ns() - cpu
                self.writes += CountingConnection.writes - before
                self.blocks.append(statistics.median(self.samples[first:]))
        except Exception as exc:
            self.status = f"error: {type(exc).__name__}: {exc}"

    def result(self) -> Result:
        """Per-pair figures for this run."""
        if self.status != "ok" or not self.samples:
            return {"status": self.status}
        calls = command_calls(self.admin)
        pairs = len(self.samples)
        return {
            "status": "ok",
            "median_us": statistics.median(self.samples) / 1000,
            "mean_us": sum(self.samples) / pairs / 1000,
            "p99_us": pct(self.samples, 99) / 1000,
            "client_cpu_us": self.cpu_ns / pairs / 1000,
            "server_cpu_us": self.server_cpu_us / pairs,
            "round_trips": self.writes / pairs,
            "commands": sum(calls.values()) / pairs,
            "breakdown": {k: v / pairs for k, v in sorted(calls.items())},
        }


_S = TypeVar("_S")


def _on_own_servers(
    stack: contextlib.ExitStack,
    contenders: Sequence[Contender],
    make: Callable[[Contender, RedisServer], _S],
) -> tuple[list[_S], dict[str, Result]]:
    """One private redis-server per contender (stopped by ``stack``) and ``make``'s session
    on it; a contender that cannot start is reported as an error row, not a crash."""
    sessions: list[_S] = []
    failed: dict[str, Result] = {}
    for contender in contenders:
        try:
            server = stack.enter_context(RedisServer())
            sessions.append(make(contender, server))
        except Exception as exc:
            failed[contender.name] = {"status": f"error: {type(exc).__name__}: {exc}"}
    return sessions, failed


def scenario_a(contenders: Sequence[Contender], params: Params, run: int) -> dict[str, Result]:
    """Uncontended acquire+release pairs, all contenders interleaved in blocks of 50 pairs.

    Each contender has its own server and client; blocks run round-robin in a shuffled
    order, so a slow phase of the machine hits every contender alike.
    """
    rng = random.Random(3000 + run)
    with contextlib.ExitStack() as stack:
        timers, failed = _on_own_servers(stack, contenders, lambda c, s: _PairTimer(c, s, run))
        for timer in timers:
            timer.pairs(params.a_warmup, timed=False)
            with contextlib.suppress(redis.RedisError):
                timer.admin.config_resetstat()
        cpu_before = {t.name: server_cpu_us(t.admin) for t in timers}
        block = 50
        for _ in range(0, params.a_pairs, block):
            rng.shuffle(timers)
            for timer in timers:
                timer.pairs(block, timed=True)
        for timer in timers:
            timer.server_cpu_us = server_cpu_us(timer.admin) - cpu_before[timer.name]
        results = {t.name: t.result() for t in timers}
        floor = next((t for t in timers if t.name == "floor" and t.status == "ok"), None)
        for timer in timers:
            if floor is not None and timer.status == "ok" and timer.blocks:
                pairs = zip(timer.blocks, floor.blocks, strict=False)
                results[timer.name]["x_floor"] = statistics.median(c / f for c, f in pairs)
        for timer in timers:
            timer.client.close()
            timer.admin.close()
    return failed | results


# --- B: the flash-sale test -----------------------------------------------------------


def _b_child(
    *,
    url: str,
    name: str,
    key: str,
    counter: str,
    params: Params,
    ready: Any,
    go: Any,
    out: Any,
) -> None:
    """One process of the flash-sale test: ``b_threads`` clients, each its own connection."""
    factory = CONTENDERS[name].factory
    local_ready = threading.Barrier(params.b_threads + 1)
    records: list[Result] = [
        {"waits": [], "done": 0, "acquire_timeouts": 0, "release_errors": 0, "error": None}
        for _ in range(params.b_threads)
    ]

    def work(rec: Result) -> None:
        handle = None
        try:
            client = make_client(url)
            client.ping()
            handle = factory(client, key, params.b_lease)
        except Exception as exc:
            rec["error"] = f"setup: {exc!r}"
        try:
            local_ready.wait(timeout=60)
        except threading.BrokenBarrierError:
            return
        if handle is None:
            return
        if not go.wait(timeout=120):
            rec["error"] = "never started"
            return
        deadline = time.monotonic() + params.b_budget
        try:
            for _ in range(params.b_per_thread):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                t0 = now_ns()
                acquired = handle.acquire(remaining)
                t1 = now_ns()
                if not acquired:
                    rec["acquire_timeouts"] += 1
                    break
                rec["waits"].append(t1 - t0)
                try:
                    value = client.get(counter)  # the critical section: read,
                    client.set(counter, int(value or 0) + 1)  # increment, write back
                    rec["done"] += 1
                finally:
                    try:
                        handle.release()
                    except Exception as exc:
                        rec["release_errors"] += 1
                        rec["error"] = f"release: {exc!r}"
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["finish"] = now_ns()

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in records]
    for thread in threads:
        thread.start()
    try:
        local_ready.wait(timeout=60)
        ready.wait(timeout=60)
    except threading.BrokenBarrierError:
        out.put([{"error": "start barrier broken"}])
        return
    end = time.monotonic() + params.b_budget + 30
    for thread, rec in zip(threads, records, strict=True):
        thread.join(timeout=max(0.0, end - time.monotonic()))
        rec["hung"] = thread.is_alive()
    out.put(records)


def scenario_b(contender: Contender, params: Params, run: int) -> Result:
    """100 clients, 1000 read-increment-write critical sections on one lock."""
    key, counter = f"bench:b:{run}:lock", f"bench:b:{run}:counter"
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        warm = contender.factory(admin, f"bench:b:{run}:warmup", params.b_lease)
        if not warm.acquire(5.0):  # loads any scripts, so no SCRIPT LOAD is counted
            return {"status": "warm-up acquire returned False"}
        warm.release()
        ready = CTX.Barrier(params.b_procs + 1)
        go = CTX.Event()
        out = CTX.Queue()
        procs = [
            CTX.Process(
                target=_b_child,
                kwargs={
                    "url": server.url,
                    "name": contender.name,
                    "key": key,
                    "counter": counter,
                    "params": params,
                    "ready": ready,
                    "go": go,
                    "out": out,
                },
                daemon=True,
            )
            for _ in range(params.b_procs)
        ]
        for proc in procs:
            proc.start()
        records: list[Result] = []
        status = "ok"
        t0 = 0
        try:
            ready.wait(timeout=90)
            admin.config_resetstat()
            t0 = now_ns()
            go.set()
            end = time.monotonic() + params.b_budget + 45
            for _ in procs:
                records.extend(out.get(timeout=max(0.1, end - time.monotonic())))
        except (threading.BrokenBarrierError, OSError, EOFError) as exc:
            status = f"error: {exc!r}"
        except Exception:  # queue.Empty: a process never reported
            status = "timeout"
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        calls = command_calls(admin)
        final = int(admin.get(counter) or 0)
        admin.close()
    done = sum(r.get("done", 0) for r in records)
    waits = [w / 1e6 for r in records for w in r.get("waits", [])]
    finishes = [r["finish"] for r in records if r.get("finish")]
    errors = sorted({r["error"] for r in records if r.get("error")})
    timeouts = sum(r.get("acquire_timeouts", 0) for r in records)
    hung = sum(1 for r in records if r.get("hung"))
    expected = params.b_procs * params.b_threads * params.b_per_thread
    if status == "ok" and (timeouts or hung or done < expected):
        status = "timeout"
    if errors and status == "ok":
        status = "errors"
    wall = (max(finishes) - t0) / 1e9 if finishes and t0 else float("nan")
    return {
        "status": status,
        "errors": errors[:5],
        "expected": expected,
        "done": done,
        "final_counter": final,
        "lost": done - final,
        "wall_s": wall,
        "throughput": done / wall if wall > 0 else float("nan"),
        "wait_p50_ms": pct(waits, 50),
        "wait_p99_ms": pct(waits, 99),
        "wait_max_ms": max(waits) if waits else float("nan"),
        "waits_over_500ms": sum(1 for w in waits if w > 500),
        "commands": sum(calls.values()) / done if done else float("nan"),
        "breakdown": {k: v / done for k, v in sorted(calls.items())} if done else {},
        "acquire_timeouts": timeouts,
        "release_errors": sum(r.get("release_errors", 0) for r in records),
    }


# --- C: hand-off latency --------------------------------------------------------------


def _c_holder(*, url: str, name: str, key: str, seed: int, conn: Connection) -> None:
    """On each "start": take the lock, let the waiter block, hold 10-30 ms, stamp, release."""
    client = make_client(url)
    handle = CONTENDERS[name].factory(client, key, 30.0)
    rng = random.Random(seed)
    while conn.poll(600) and conn.recv() == "start":
        if not handle.acquire(10.0):
            conn.send(("error", "holder could not acquire a free lock"))
            return
        conn.send(("held", None))
        if not conn.poll(30):
            return
        conn.recv()  # the waiter is about to call acquire()
        time.sleep(rng.uniform(0.010, 0.030))
        t_release = now_ns()
        handle.release()
        conn.send(("released", t_release))


class _HandOff:
    """One contender of scenario C: its server, a holder process and the waiter's lock."""

    def __init__(self, contender: Contender, server: RedisServer, run: int) -> None:
        self.name = contender.name
        self.client = make_client(server.url)
        key = f"bench:c:{run}"
        self.handle = contender.factory(self.client, key, 30.0)
        self.pipe, theirs = CTX.Pipe()
        self.holder = CTX.Process(
            target=_c_holder,
            kwargs={
                "url": server.url,
                "name": contender.name,
                "key": key,
                "seed": 1000 + run,
                "conn": theirs,
            },
            daemon=True,
        )
        self.holder.start()
        self.latencies: list[float] = []
        self.spent = 0.0
        self.status = "ok"

    def samples(self, count: int, record: bool, budget: float) -> None:
        """Run ``count`` hand-offs, recording latencies when ``record``."""
        started = time.monotonic()
        try:
            for _ in range(count):
                if self.status != "ok":
                    return
                if self.spent + time.monotonic() - started > budget:
                    self.status = "timeout"
                    return
                self._one(record)
        except Exception as exc:
            self.status = f"error: {type(exc).__name__}: {exc}"
        finally:
            self.spent += time.monotonic() - started

    def _one(self, record: bool) -> None:
        self.pipe.send("start")
        if not self.pipe.poll(30):
            self.status = "holder stopped answering"
            return
        kind, detail = self.pipe.recv()
        if kind != "held":
            self.status = f"holder: {detail}"
            return
        self.pipe.send("waiting")
        acquired = self.handle.acquire(10.0)
        t_acquired = now_ns()
        if not self.pipe.poll(30):
            self.status = "holder never released"
            return
        _, t_release = self.pipe.recv()
        if not acquired:
            self.status = "waiter timed out (10 s)"
            return
        self.handle.release()
        if record:
            self.latencies.append((t_acquired - t_release) / 1e6)

    def close(self) -> Result:
        """Stop the holder and summarise."""
        with contextlib.suppress(OSError):
            self.pipe.send("stop")
        self.holder.join(timeout=5)
        if self.holder.is_alive():
            self.holder.kill()
            self.holder.join(timeout=5)
        self.client.close()
        lat = self.latencies
        return {
            "status": self.status,
            "samples": len(lat),
            "p50_ms": pct(lat, 50),
            "p90_ms": pct(lat, 90),
            "p99_ms": pct(lat, 99),
            "max_ms": max(lat) if lat else float("nan"),
        }


def scenario_c(contenders: Sequence[Contender], params: Params, run: int) -> dict[str, Result]:
    """Release-to-acquire latency, all contenders interleaved in blocks of 20 hand-offs."""
    rng = random.Random(4000 + run)
    with contextlib.ExitStack() as stack:
        sessions, failed = _on_own_servers(stack, contenders, lambda c, s: _HandOff(c, s, run))
        try:
            for session in sessions:
                session.samples(params.c_warmup, record=False, budget=params.c_budget)
            block = 20
            for _ in range(0, params.c_samples, block):
                rng.shuffle(sessions)
                for session in sessions:
                    session.samples(block, record=True, budget=params.c_budget)
        finally:
            results = {s.name: s.close() for s in sessions}
    return failed | results


# --- D: SIGKILLed holder --------------------------------------------------------------


def _d_holder(url: str, name: str, key: str, lease: float, conn: Connection) -> None:
    """Acquire with a short lease, report the server time around it, then wait to be killed."""
    client = make_client(url)
    handle = CONTENDERS[name].factory(client, key, lease)
    before = server_time_us(client)
    acquired = handle.acquire(5.0)
    after = server_time_us(client)
    conn.send((acquired, before, after, now_ns()))
    time.sleep(30)  # SIGKILLed long before this ends


def _d_sample(contender: Contender, url: str, key: str, lease: float, start: float) -> Result:
    """One kill: the waiter blocks at ``start`` x lease into the hold; the holder dies 50 ms on."""
    client = make_client(url)
    handle = contender.factory(client, key, lease)
    mine, theirs = CTX.Pipe()
    holder = CTX.Process(target=_d_holder, args=(url, contender.name, key, lease, theirs))
    holder.start()
    killer: threading.Timer | None = None
    try:
        if not mine.poll(15):
            return {"status": "holder did not acquire"}
        acquired, before_us, after_us, t_local = mine.recv()
        if not acquired:
            return {"status": "holder could not acquire a free lock"}
        waiter_start = start * lease
        time.sleep(max(0.0, t_local / 1e9 + waiter_start - now_ns() / 1e9))
        pid = holder.pid
        assert pid is not None
        killer = threading.Timer(0.05 * lease, os.kill, (pid, signal.SIGKILL))
        killer.start()
        got = handle.acquire(lease + 10.0)
        got_us = server_time_us(client)
        killer.join()
        holder.join(timeout=5)
        if holder.exitcode != -signal.SIGKILL:
            return {"status": f"holder was not SIGKILLed (exit {holder.exitcode})"}
        if not got:
            return {"status": "waiter never acquired (lease + 10 s)"}
        handle.release()
        expiry_us = (before_us + after_us) / 2 + lease * 1_000_000
        return {
            "status": "ok",
            "late_ms": (got_us - expiry_us) / 1000,
            "uncertainty_ms": (after_us - before_us) / 2000,
            "waiter_start_s": waiter_start,
        }
    finally:
        if killer is not None:
            killer.cancel()
        if holder.is_alive():
            holder.kill()
        holder.join(timeout=5)
        client.close()


def scenario_d(contender: Contender, params: Params, run: int) -> Result:
    """``d_samples`` SIGKILLed holders; ms from lease expiry until the waiter holds the lock."""
    # Stratified random start points: one in each of n equal slices of 10-90 % of the lease.
    rng = random.Random(2000 + run)
    n = params.d_samples
    starts = [0.1 + 0.8 * (i + rng.random()) / n for i in range(n)]
    rng.shuffle(starts)
    lates: list[float] = []
    points: list[tuple[float, float, float]] = []
    status = "ok"
    with RedisServer() as server:
        for i, start in enumerate(starts):
            sample = _d_sample(contender, server.url, f"bench:d:{run}:{i}", params.d_lease, start)
            if sample["status"] != "ok":
                status = sample["status"]
                break
            lates.append(sample["late_ms"])
            points.append((start, sample["late_ms"], sample["uncertainty_ms"]))
    return {
        "status": status,
        "samples": len(lates),
        "late_median_ms": statistics.median(lates) if lates else float("nan"),
        "late_min_ms": min(lates) if lates else float("nan"),
        "late_max_ms": max(lates) if lates else float("nan"),
        "late_all_ms": lates,
        "samples_start_late_uncertainty": points,
    }


# --- running and reporting ------------------------------------------------------------

# Interleaved scenarios take every contender at once; sequential ones take one at a time.
INTERLEAVED: dict[str, Callable[[Sequence[Contender], Params, int], dict[str, Result]]] = {
    "A": scenario_a,
    "C": scenario_c,
}
SEQUENTIAL: dict[str, Callable[[Contender, Params, int], Result]] = {
    "B": scenario_b,
    "D": scenario_d,
}


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    binary = find_redis_server() or "redis-server"
    try:
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except OSError as exc:
        version = f"unknown ({exc})"
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return {
        "load": load,
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis-server": version,
        "versions": ", ".join(
            f"{dist} {CONTENDERS[name].version()}"
            for name, dist in (
                ("csl", "celery-singleton-lock"),
                ("redis-py", "redis"),
                ("python-redis-lock", "python-redis-lock"),
                ("pottery", "pottery"),
            )
        ),
    }


def median_of(runs: Iterable[Result], field: str) -> float:
    """Median of one numeric field over the runs that produced it."""
    values = [r[field] for r in runs if isinstance(r.get(field), int | float)]
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 1) -> str:
    """A number for a table cell; NaN as an em dash."""
    if math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def status_of(runs: list[Result]) -> str:
    """``ok`` or the first non-ok status."""
    for run in runs:
        if run.get("status") != "ok":
            return str(run.get("status"))
    return "ok"


Table = tuple[list[str], list[list[str]]]


def markdown(table: Table) -> str:
    """Render a header and rows as a markdown table."""
    header, rows = table
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float, reference: float, digits: int = 2) -> str:
    """``value / reference`` as ``1.23x``."""
    if math.isnan(value) or math.isnan(reference) or reference == 0:
        return "—"
    return f"{value / reference:.{digits}f}x"


def times(value: float) -> str:
    """A ratio as ``1.23x``."""
    return "—" if math.isnan(value) else f"{value:.2f}x"


def table_a(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario A table."""
    floor = median_of(results.get("floor", []), "median_us")
    header = ["lock", "µs/pair (median)", "x floor", "x floor (paired)", "round trips/pair"]
    header += ["commands/pair", "client CPU µs/pair", "server CPU µs/pair"]
    header += ["mean µs/pair", "status"]
    rows = []
    for name in CONTENDERS:
        if name in na:
            rows.append([name, "N/A", "", "", "", "", "", "", "", na[name]])
            continue
        runs = results.get(name, [])
        us = median_of(runs, "median_us")
        x_floor = median_of(runs, "x_floor")
        rows.append(
            [
                name,
                fmt(us),
                ratio(us, floor),
                times(x_floor),
                fmt(median_of(runs, "round_trips"), 2),
                fmt(median_of(runs, "commands"), 2),
                fmt(median_of(runs, "client_cpu_us")),
                fmt(median_of(runs, "server_cpu_us")),
                fmt(median_of(runs, "mean_us")),
                status_of(runs),
            ]
        )
    return header, rows


def paired(runs: list[Result], reference: list[Result], field: str) -> float:
    """Median over runs of ``field`` / the reference's ``field`` in the same run."""
    ratios = []
    for mine, theirs in zip(runs, reference, strict=False):
        a, b = mine.get(field), theirs.get(field)
        if isinstance(a, int | float) and isinstance(b, int | float) and b and not math.isnan(a):
            ratios.append(a / b)
    ratios = [r for r in ratios if not math.isnan(r)]
    return statistics.median(ratios) if ratios else float("nan")


def table_b(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario B table."""
    prl = results.get("python-redis-lock", [])
    rpy = results.get("redis-py", [])
    header = ["lock", "lost updates (worst run)", "CS/s", "x python-redis-lock", "x redis-py"]
    header += ["wait p50 ms", "wait p99 ms", "p99 x python-redis-lock", "commands/CS", "status"]
    rows = []
    for name in CONTENDERS:
        if name in na:
            rows.append([name, "N/A", "", "", "", "", "", "", "", na[name]])
            continue
        runs = results.get(name, [])
        lost = [r["lost"] for r in runs if "lost" in r]
        rows.append(
            [
                name,
                str(max(lost)) if lost else "—",
                fmt(median_of(runs, "throughput"), 0),
                times(paired(runs, prl, "throughput")),
                times(paired(runs, rpy, "throughput")),
                fmt(median_of(runs, "wait_p50_ms")),
                fmt(median_of(runs, "wait_p99_ms")),
                times(paired(runs, prl, "wait_p99_ms")),
                fmt(median_of(runs, "commands"), 1),
                status_of(runs),
            ]
        )
    return header, rows


def table_b_breakdown(results: dict[str, list[Result]]) -> Table:
    """Scenario B: Redis commands per critical section, by command (median run)."""
    header = ["lock", "commands per critical section, by command (median over runs)"]
    rows = []
    for name in CONTENDERS:
        runs = [r for r in results.get(name, []) if r.get("breakdown")]
        if not runs:
            continue
        names = sorted({c for r in runs for c in r["breakdown"]})
        parts = []
        for command in names:
            value = statistics.median(r["breakdown"].get(command, 0.0) for r in runs)
            if value >= 0.005:
                parts.append(f"{command} {value:.2f}")
        rows.append([name, ", ".join(parts)])
    return header, rows


def table_c(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario C table."""
    header = ["lock", "hand-off p50 ms", "p90 ms", "p99 ms", "max ms", "samples/run", "status"]
    rows = []
    for name in CONTENDERS:
        if name in na:
            rows.append([name, "N/A", "", "", "", "", na[name]])
            continue
        runs = results.get(name, [])
        rows.append(
            [
                name,
                fmt(median_of(runs, "p50_ms"), 2),
                fmt(median_of(runs, "p90_ms"), 2),
                fmt(median_of(runs, "p99_ms"), 2),
                fmt(max((r.get("max_ms", float("nan")) for r in runs), default=float("nan")), 2),
                fmt(median_of(runs, "samples"), 0),
                status_of(runs),
            ]
        )
    return header, rows


def table_d(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario D table."""
    header = ["lock", "ms after lease expiry (median)", "min ms", "max ms", "samples", "status"]
    rows = []
    for name in CONTENDERS:
        if name in na:
            rows.append([name, "N/A", "", "", "", na[name]])
            continue
        runs = results.get(name, [])
        pooled = [v for r in runs for v in r.get("late_all_ms", [])]
        rows.append(
            [
                name,
                fmt(median_of(runs, "late_median_ms")),
                fmt(min(pooled), 1) if pooled else "—",
                fmt(max(pooled), 1) if pooled else "—",
                str(len(pooled)),
                status_of(runs),
            ]
        )
    return header, rows


def targets(results: dict[str, dict[str, list[Result]]], who: str = "csl") -> list[str]:
    """The issue's targets for ``who``, each marked met / MISSED / not measured."""

    def get(scenario: str, name: str, field: str) -> float:
        return median_of(results.get(scenario, {}).get(name, []), field)

    def line(text: str, values: Sequence[float], ok: Callable[[], bool]) -> str:
        measured = bool(values) and not any(math.isnan(v) for v in values)
        return f"- {text} -> {('met' if ok() else 'MISSED') if measured else 'not measured'}"

    rt, x_floor = get("A", who, "round_trips"), get("A", who, "x_floor")
    lost_runs = [r["lost"] for r in results.get("B", {}).get(who, []) if "lost" in r]
    lost = float(max(lost_runs)) if lost_runs else float("nan")
    b = results.get("B", {})
    x_prl = paired(b.get(who, []), b.get("python-redis-lock", []), "throughput")
    x_rpy = paired(b.get(who, []), b.get("redis-py", []), "throughput")
    x_p99 = paired(b.get(who, []), b.get("python-redis-lock", []), "wait_p99_ms")
    p99, prl99 = get("B", who, "wait_p99_ms"), get("B", "python-redis-lock", "wait_p99_ms")
    cmds = get("B", who, "commands")
    p50, c99 = get("C", who, "p50_ms"), get("C", who, "p99_ms")
    late = get("D", who, "late_median_ms")
    return [
        line(
            f"A. 2 round trips/pair and <= 1.1x floor: {fmt(rt, 2)} round trips, "
            f"{fmt(x_floor, 2)}x floor (paired)",
            [rt, x_floor],
            lambda: rt <= 2.0 and x_floor <= 1.1,
        ),
        line(f"B. 0 lost updates: {fmt(lost, 0)}", [lost], lambda: lost == 0),
        line(
            f"B. throughput >= 1.2x python-redis-lock: {times(x_prl)}",
            [x_prl],
            lambda: x_prl >= 1.2,
        ),
        line(f"B. throughput >= 2x redis-py default: {times(x_rpy)}", [x_rpy], lambda: x_rpy >= 2),
        line(
            f"B. wait p99 <= python-redis-lock's: {fmt(p99)} vs {fmt(prl99)} ms "
            f"({times(x_p99)} per run)",
            [x_p99],
            lambda: x_p99 <= 1,
        ),
        line(f"B. <= 12 commands/critical section: {fmt(cmds)}", [cmds], lambda: cmds <= 12),
        line(
            f"C. hand-off p50 <= 1 ms and p99 <= 3 ms: {fmt(p50, 2)} / {fmt(c99, 2)} ms",
            [p50, c99],
            lambda: p50 <= 1 and c99 <= 3,
        ),
        line(f"D. <= 50 ms after lease expiry: {fmt(late)} ms", [late], lambda: late <= 50),
    ]


TABLES: dict[str, tuple[str, Callable[[dict[str, list[Result]], dict[str, str]], Table]]] = {
    "A": ("A. Uncontended acquire+release, one client", table_a),
    "B": ("B. Flash sale: 100 clients (10 processes x 10 threads), one lock", table_b),
    "C": ("C. Hand-off latency: holder's release → blocked waiter's acquire", table_c),
    "D": ("D. SIGKILLed holder (lease 1 s): waiter's acquire after lease expiry", table_d),
}

NOTES: dict[str, str] = {
    "A": (
        "{a_pairs} pairs per run after {a_warmup} warm-up pairs, all contenders interleaved in "
        "blocks of 50 (shuffled order, each on its own server); µs/pair is the median pair; "
        "x floor (paired) is the median over blocks of (block median / the floor's block "
        "median in the same round), robust to machine drift; "
        "round trips = socket writes counted in a wrapped redis-py Connection (a pipeline is "
        "one); commands = INFO commandstats delta, including commands run inside Lua; client CPU = "
        "the benchmark thread's CPU time per pair (lock library + redis-py + socket syscalls); "
        "server CPU = the redis-server main thread's CPU time (INFO cpu) over the timed phase "
        "/ pairs (includes its idle timer ticks, alike for all)."
    ),
    "B": (
        "{b_procs} processes x {b_threads} threads, {b_per_thread} critical sections each "
        "(GET counter, +1, SET counter; non-atomic on purpose), lease {b_lease:g} s; "
        "throughput = completed critical sections / wall time from the shared start event to "
        "the last finish; wait = time inside acquire(); commands/CS = every INFO "
        "commandstats call (Lua-internal included, our INFO/CONFIG excluded) / critical sections; "
        "contenders run one after another in a fresh random order per run (CPU-heavy pollers "
        "last); ratios are medians of per-run ratios."
    ),
    "C": (
        "Holder and waiter are two processes with their own connections; the waiter is "
        "blocked in acquire() while the holder holds 10-30 ms (random); latency = waiter's "
        "acquire() return - the instant just before the holder's release() call "
        "(CLOCK_MONOTONIC); {c_samples} samples per run after {c_warmup} warm-up, all "
        "contenders interleaved in blocks of 20 (shuffled order, each on its own server)."
    ),
    "D": (
        "A child process acquires with a {d_lease:g} s lease; the waiter calls acquire() at a "
        "random point in 10-90 % of the lease (stratified: one per slice) and the holder is "
        "SIGKILLed 50 ms later; late = server TIME when the waiter's acquire() returned - "
        "(server TIME at the holder's acquire, midpoint of TIME just before and after it, + "
        "lease), so +-0.1-0.3 ms. {d_samples} kills per run."
    ),
}


def render(
    results: dict[str, dict[str, list[Result]]],
    na: dict[str, str],
    params: Params,
    info: dict[str, str],
    command: str,
) -> str:
    """The whole report as markdown."""
    out = [
        f"Command: `{command}`",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']}, "
        f"{info['redis-server']}; {info['platform']}; load average at start {info['load']}, "
        f"at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}",
        f"Versions: {info['versions']}. Values are medians over {params.runs} run(s).",
    ]
    for scenario, (title, build) in TABLES.items():
        if scenario not in results:
            continue
        out += ["", f"### {title}", "", NOTES[scenario].format(**vars(params)), ""]
        out.append(markdown(build(results[scenario], na)))
        if scenario == "B":
            out += ["", markdown(table_b_breakdown(results[scenario]))]
    if "csl" not in na:
        out += ["", "### Targets for `csl` (from issue 2)", "", *targets(results)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lock", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations: a smoke check")
    parser.add_argument("--runs", type=int, help="runs per scenario (default 3, quick 1)")
    parser.add_argument("--json", metavar="PATH", help="also write raw results as JSON")
    parser.add_argument("--scenarios", default="ABCD", help="subset to run, e.g. AB")
    parser.add_argument("--contenders", help="comma-separated subset of: " + ", ".join(CONTENDERS))
    args = parser.parse_args(argv)
    params = Params.build(args.quick, args.runs)
    chosen = args.contenders.split(",") if args.contenders else list(CONTENDERS)
    unknown = set(chosen) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    na = {c.name: why for c in CONTENDERS.values() if (why := c.unavailable())}
    na.update({name: "not selected" for name in CONTENDERS if name not in chosen})
    scenarios = [s for s in args.scenarios.upper() if s in INTERLEAVED or s in SEQUENTIAL]
    runnable = [c for c in CONTENDERS.values() if c.name not in na]
    info = machine_info()
    results: dict[str, dict[str, list[Result]]] = {}
    started = time.monotonic()

    def progress(text: str, t0: float) -> None:
        elapsed = f"[{time.monotonic() - started:6.1f}s]"
        print(f"{elapsed} {text} ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    for scenario in scenarios:
        results[scenario] = {}
        for run in range(params.runs):
            label = f"{scenario} run {run + 1}/{params.runs}"
            t0 = time.monotonic()
            if scenario in INTERLEAVED:
                for name, result in INTERLEAVED[scenario](runnable, params, run).items():
                    results[scenario].setdefault(name, []).append(result)
                progress(f"{label}: all contenders", t0)
                continue
            # A fresh random order per run, CPU-heavy waiters last, so drift of a shared
            # machine does not always hit the same contender.
            order = random.Random(5000 + run).sample(runnable, len(runnable))
            order.sort(key=lambda c: c.heavy)
            for contender in order:
                t0 = time.monotonic()
                try:
                    result = SEQUENTIAL[scenario](contender, params, run)
                except Exception as exc:
                    result = {"status": f"error: {type(exc).__name__}: {exc}"}
                result["load1"] = os.getloadavg()[0]
                results[scenario].setdefault(contender.name, []).append(result)
                progress(f"{label} {contender.name}: {result.get('status')}", t0)
    command = "python -m benchmarks.bench_lock " + shlex.join(list(argv or sys.argv[1:]))
    report = render(results, na, params, info, command.strip())
    print(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {"command": command, "machine": info, "params": vars(params), "na": na,
                 "results": results},
                fh,
                indent=1,
                default=str,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

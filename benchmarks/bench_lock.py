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
import dataclasses
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
from typing import Any, ClassVar, TypeVar

import redis

from benchmarks.contenders import (
    CONTENDERS,
    FAIR_CONTENDERS,
    FAIR_MS,
    Contender,
    CslLock,
    make_client,
)
from benchmarks.fairness import Hold, head_waits, percentile
from celery_singleton_lock.testing import RedisServer, find_redis_server

Result = dict[str, Any]
CTX = mp.get_context("fork")  # children inherit the contender table; Linux only, like the server


def now_ns() -> int:
    """System-wide monotonic clock, comparable across processes on one host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


#: The ``q``-th percentile (0-100) with linear interpolation (one definition, in fairness).
pct = percentile


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


def contender(name: str) -> Contender:
    """A contender of A-D and S, or one of scenario B's ``fair_after`` variants."""
    return CONTENDERS[name] if name in CONTENDERS else FAIR_CONTENDERS[name]


#: Every contender of scenario B: those of the other scenarios, then the fair_after ones.
def b_names() -> list[str]:
    return [*CONTENDERS, *FAIR_CONTENDERS]


class StampingConnection(redis.Connection):
    """A connection that stamps (CLOCK_MONOTONIC ns) the first request written after its
    ``first_send`` was reset to 0, and the first reply read after that (``first_reply``):
    scenario B's queue-entry interval of an acquire."""

    first_send = 0
    first_reply = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.first_send:
            self.first_send = now_ns()
            self.first_reply = 0
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self.first_send and not self.first_reply:
            self.first_reply = now_ns()
        return reply


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
    e_waiters: tuple[int, ...] = (10, 30, 100, 300, 1000)
    e_procs: int = 4
    e_lease: float = 60.0
    e_budget: float = 60.0
    e_poll_budget: float = 30.0
    e_stagger: float = 1.0

    @classmethod
    def build(cls, quick: bool, runs: int | None, waiters: tuple[int, ...] | None = None) -> Params:
        """Full or ``--quick`` settings; ``waiters``: scenario E's waiter counts."""
        if quick:
            params = cls(runs or 1, 300, 50, 10, 10, 2, 10.0, 60.0, 20, 2, 30.0, 2, 1.0,
                         e_waiters=(10, 100))  # fmt: skip
        else:
            params = cls(runs or 3, 2000, 200, 10, 10, 10, 10.0, 120.0, 200, 5, 150.0, 7, 1.0)
        return dataclasses.replace(params, e_waiters=waiters) if waiters else params


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
    factory = contender(name).factory
    local_ready = threading.Barrier(params.b_threads + 1)
    records: list[Result] = [
        {"waits": [], "holds": [], "done": 0, "acquire_timeouts": 0, "release_errors": 0,
         "error": None}
        for _ in range(params.b_threads)
    ]  # fmt: skip

    def work(rec: Result) -> None:
        handle = None
        try:
            client = make_client(url, connection_class=StampingConnection)
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
                connection = client.connection
                if connection is not None:
                    connection.first_send = 0  # type: ignore[attr-defined]
                t0 = now_ns()
                acquired = handle.acquire(remaining)
                t1 = now_ns()
                if not acquired:
                    rec["acquire_timeouts"] += 1
                    break
                rec["waits"].append(t1 - t0)
                enq = getattr(connection, "first_send", 0) or t0
                replied = getattr(connection, "first_reply", 0) or t1
                try:
                    value = client.get(counter)  # the critical section: read,
                    client.set(counter, int(value or 0) + 1)  # increment, write back
                    rec["done"] += 1
                finally:
                    rec["holds"].append((enq, t1, now_ns(), replied))
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
    holds = [Hold(*h) for r in records for h in r.get("holds", [])]
    fair_ms = FAIR_MS.get(contender.name, 0.0)
    return {
        "fair_ms": fair_ms,
        "fairness": head_waits(holds, int(fair_ms * 1e6)),
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


# --- E: waiters scaling ---------------------------------------------------------------


class TimedConnection(redis.Connection):
    """A connection that logs every request it sends: (CLOCK_MONOTONIC ns, command), with
    the script's SHA1 for EVALSHA; a pipeline is one ``pipeline`` entry.

    The log is per process (threads append to one list; ``list.append`` is atomic).
    """

    log: ClassVar[list[tuple[int, str]]] = []
    _single = False

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        name = str(args[0]).upper()
        if name == "EVALSHA":
            name = f"EVALSHA:{args[1]}"
        TimedConnection.log.append((now_ns(), name))
        self._single = True
        try:
            super().send_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        finally:
            self._single = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._single:
            TimedConnection.log.append((now_ns(), "pipeline"))
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def requests_since(t0: int) -> dict[str, int]:
    """Requests this process sent from ``t0`` on, by command."""
    counts: dict[str, int] = {}
    for stamp, name in TimedConnection.log:
        if stamp >= t0:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _csl_acquire_try() -> str:
    """How our ACQUIRE script shows in a ``TimedConnection`` log (EVALSHA of its SHA1)."""
    try:
        from celery_singleton_lock.engine.scripts import SCRIPTS  # noqa: PLC0415

        return "EVALSHA:" + SCRIPTS["acquire"].sha
    except Exception:  # the engine's layout changed: polls are then shown as "—"
        return "EVALSHA:?"


@dataclass(frozen=True)
class Waiting:
    """A lock configuration of scenario E and how to read its waiters' requests.

    ``tries``: the request that is one acquire attempt; ``needed``: how many of those one
    hand-off needs (a waiter woken by a signal still has to take the lock: 1; a waiter
    handed the lock in its wake-up: 0); every further attempt is a poll. ``blocks``: its
    waiters block in Redis (BLPOP), so "all blocked" is read from ``blocked_clients``.
    """

    contender: Contender
    tries: Callable[[], str]
    needed: int
    blocks: bool
    queue: bool = False  # ours: the waiters' queue is a sorted set whose size can be read


E_WAITING: dict[str, Waiting] = {
    w.contender.name: w
    for w in (
        Waiting(
            Contender(
                "csl fallback_poll=30",
                lambda c, k, lease: CslLock(c, k, lease, scripting=True, fallback_poll=30.0),
                "celery_singleton_lock",
                "celery-singleton-lock",
                "RedisLock(client, name, timeout=lease, fallback_poll=30)",
            ),
            _csl_acquire_try,
            0,
            blocks=True,
            queue=True,
        ),
        Waiting(CONTENDERS["csl"], _csl_acquire_try, 0, blocks=True, queue=True),
        Waiting(CONTENDERS["python-redis-lock"], lambda: "SET", 1, blocks=True),
        Waiting(CONTENDERS["redis-py"], lambda: "SET", 1, blocks=False),
    )
}
#: Contenders of A-D left out of E, and why.
E_LEFT_OUT: dict[str, str] = {
    "csl-plain": "not measured: plain mode is the no-EVAL fallback, not a contender here",
    "redis-py sleep=0.001": "not measured: N threads polling every 1 ms saturate 2 CPUs",
    "pottery": "not measured: polls like redis-py (random sleep up to 0.2 s)",
    "floor": "not measured: busy-spins, N spinning threads saturate 2 CPUs",
}


def _e_child(
    *,
    url: str,
    name: str,
    key: str,
    threads: int,
    lease: float,
    wait_s: float,
    stagger: float,
    seed: int,
    ready: Any,
    go: Any,
    started: Any,
    released_at: Any,
    out: Any,
) -> None:
    """``threads`` waiters, each with its own connection: block on the held lock, take it,
    release it at once, exit. Reports each waiter's acquire and release instants and the
    requests sent after the first release."""
    threading.stack_size(512 * 1024)
    TimedConnection.log = []
    factory = E_WAITING[name].contender.factory
    local_ready = threading.Barrier(threads + 1)
    records: list[Result] = [
        {"acq": 0, "rel": 0, "ok": False, "error": None} for _ in range(threads)
    ]

    def work(rec: Result, delay: float) -> None:
        handle = client = None
        try:
            client = make_client(url, connection_class=TimedConnection)
            client.ping()
            handle = factory(client, key, lease)
        except Exception as exc:
            rec["error"] = f"setup: {exc!r}"
        try:
            local_ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            return
        if handle is None or client is None:
            return
        if not go.wait(timeout=180):
            rec["error"] = "never started"
            return
        time.sleep(delay)  # random arrival: waiters' poll timers are not in step
        with started.get_lock():
            started.value += 1
        try:
            ok = handle.acquire(wait_s)
            rec["acq"] = now_ns()
            if ok:
                rec["ok"] = True
                rec["rel"] = now_ns()
                handle.release()
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()

    rng = random.Random(seed)
    pool = [
        threading.Thread(target=work, args=(r, rng.uniform(0, stagger)), daemon=True)
        for r in records
    ]
    for thread in pool:
        thread.start()
    try:
        local_ready.wait(timeout=120)
        ready.wait(timeout=120)
    except threading.BrokenBarrierError:
        out.put({"records": [{"error": "start barrier broken"}], "requests": {}})
        return
    end = time.monotonic() + wait_s + 30
    for thread in pool:
        thread.join(timeout=max(0.0, end - time.monotonic()))
    hung = sum(1 for thread in pool if thread.is_alive())
    out.put({"records": records, "requests": requests_since(released_at.value), "hung": hung})


def _e_wait_blocked(admin: redis.Redis, waiting: Waiting, queue_key: str | None, n: int,
                    started: Any) -> tuple[str, int, int | None]:  # fmt: skip
    """Wait (bounded) until all ``n`` waiters are waiting: started, queued (ours) and
    blocked in Redis (blocking contenders), or a settle time (pollers). Returns a status,
    the blocked clients and the queue length at that moment."""
    deadline = time.monotonic() + 90
    while started.value < n:
        if time.monotonic() > deadline:
            return f"only {started.value}/{n} waiters started", 0, None
        time.sleep(0.02)
    if not waiting.blocks:
        time.sleep(0.3)  # a few of their 0.1 s polls: every poller has found the lock held
        return "ok", int(admin.info("clients")["blocked_clients"]), None
    deadline = time.monotonic() + 60
    while True:
        blocked = int(admin.info("clients")["blocked_clients"])
        queued = int(admin.zcard(queue_key)) if queue_key else None
        if blocked >= n and (queued is None or queued >= n):
            return "ok", blocked, queued
        if time.monotonic() > deadline:
            return f"only {blocked}/{n} waiters blocked (queue {queued})", blocked, queued
        time.sleep(0.02)


def scenario_e_point(waiting: Waiting, n: int, params: Params, run: int) -> Result:
    """One point of scenario E: ``n`` waiters blocked on one held lock, then released."""
    contender = waiting.contender
    key = f"bench:e:{run}:{n}"
    procs_n = max(1, min(params.e_procs, n))
    shares = [n // procs_n + (1 if i < n % procs_n else 0) for i in range(procs_n)]
    wait_s = params.e_budget if waiting.blocks else params.e_poll_budget
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        maxclients = int(admin.config_get("maxclients")["maxclients"])
        if n + 16 > maxclients:
            admin.close()
            return {"status": f"not measured: maxclients {maxclients} < {n} waiters + 16"}
        warm = contender.factory(admin, f"bench:e:{run}:warmup", params.e_lease)
        if not warm.acquire(5.0):  # loads any scripts, so no SCRIPT LOAD is counted
            return {"status": "warm-up acquire returned False"}
        warm.release()
        TimedConnection.log = []
        holder_client = make_client(server.url, connection_class=TimedConnection)
        holder_client.ping()
        holder = contender.factory(holder_client, key, params.e_lease)
        if not holder.acquire(5.0):
            return {"status": "holder could not acquire a free lock"}
        queue_key = None
        if waiting.queue:
            from celery_singleton_lock import RedisLock  # noqa: PLC0415

            queue_key = RedisLock(admin, key).protocol.queue_key
        ready = CTX.Barrier(procs_n + 1)
        go, started = CTX.Event(), CTX.Value("i", 0)
        released_at = CTX.Value("q", 0)
        out = CTX.Queue()
        procs = [
            CTX.Process(
                target=_e_child,
                kwargs={
                    "url": server.url, "name": contender.name, "key": key, "threads": share,
                    "lease": params.e_lease, "wait_s": wait_s, "stagger": params.e_stagger,
                    "seed": 7000 + 100 * run + i, "ready": ready, "go": go,
                    "started": started, "released_at": released_at, "out": out,
                },
                daemon=True,
            )
            for i, share in enumerate(shares)
        ]  # fmt: skip
        for proc in procs:
            proc.start()
        reports: list[Result] = []
        status, blocked, queued, t0 = "ok", 0, None, 0
        try:
            ready.wait(timeout=150)
            go.set()
            status, blocked, queued = _e_wait_blocked(admin, waiting, queue_key, n, started)
            admin.config_resetstat()
            cpu0 = server_cpu_us(admin)
            t0 = now_ns()
            released_at.value = t0
            holder.release()
            end = time.monotonic() + wait_s + 60
            for _ in procs:
                reports.append(out.get(timeout=max(0.1, end - time.monotonic())))
            cpu = server_cpu_us(admin) - cpu0
        except (threading.BrokenBarrierError, OSError, EOFError) as exc:
            status, cpu = f"error: {exc!r}", float("nan")
        except Exception:  # queue.Empty: a process never reported
            status, cpu = "timeout: a waiter process never reported", float("nan")
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        calls = command_calls(admin)
        admin.close()
        holder_client.close()
    records = [r for rep in reports for r in rep["records"]]
    requests: dict[str, int] = dict(requests_since(t0)) if t0 else {}
    for rep in reports:
        for command, count in rep["requests"].items():
            requests[command] = requests.get(command, 0) + count
    won = sorted((r["acq"], r["rel"]) for r in records if r.get("ok"))
    latencies, previous = [], t0
    for acquired, released in won:
        latencies.append((acquired - previous) / 1e6)
        previous = released
    errors = sorted({r["error"] for r in records if r.get("error")})
    hung = sum(rep.get("hung", 0) for rep in reports)
    if status == "ok" and (len(won) < n or hung):
        status = f"timeout: {len(won)}/{n} acquired within {wait_s:g} s"
    if status == "ok" and errors:
        status = "errors"
    tries = requests.get(waiting.tries(), 0) if not waiting.tries().endswith("?") else None
    handoffs = len(won)
    per = 1 / handoffs if handoffs else float("nan")
    return {
        "status": status,
        "n": n,
        "errors": errors[:5],
        "acquired": handoffs,
        "blocked_at_release": blocked,
        "queued_at_release": queued,
        "maxclients": maxclients,
        "drain_s": (won[-1][0] - t0) / 1e9 if won and t0 else float("nan"),
        "commands": sum(calls.values()) * per,
        "breakdown": {k: v * per for k, v in sorted(calls.items())},
        "round_trips": sum(requests.values()) * per,
        "requests": {k: v * per for k, v in sorted(requests.items())},
        "polls": (tries - waiting.needed * handoffs) * per if tries is not None else float("nan"),
        "server_cpu_us": cpu * per,
        "p50_ms": pct(latencies, 50),
        "p90_ms": pct(latencies, 90),
        "p99_ms": pct(latencies, 99),
        "max_ms": max(latencies) if latencies else float("nan"),
    }


def scenario_e(params: Params, run: int, chosen: Sequence[str],
               progress: Callable[[str, float], None]) -> dict[str, list[Result]]:  # fmt: skip
    """Every waiter count of E for every chosen configuration; a configuration that timed
    out at one count is not measured at larger ones."""
    rng = random.Random(6000 + run)
    results: dict[str, list[Result]] = {}
    gave_up: dict[str, str] = {}
    for n in params.e_waiters:
        order = rng.sample(list(chosen), len(chosen))
        order.sort(key=lambda name: not E_WAITING[name].blocks)  # pollers last
        for name in order:
            t0 = time.monotonic()
            if name in gave_up:
                result: Result = {"status": gave_up[name], "n": n}
            else:
                try:
                    result = scenario_e_point(E_WAITING[name], n, params, run)
                except Exception as exc:
                    result = {"status": f"error: {type(exc).__name__}: {exc}", "n": n}
                result["load1"] = os.getloadavg()[0]
                if result["status"] != "ok":
                    gave_up[name] = f"not measured: N={n} gave {result['status']}"
            results.setdefault(name, []).append(result)
            progress(f"E run {run + 1}/{params.runs} N={n} {name}: {result['status']}", t0)
    return results


# --- S: safety probe ---------------------------------------------------------------------


def _string_keys(admin: redis.Redis) -> dict[bytes, bytes | None]:
    """Every string key of the server and its value."""
    return {k: admin.get(k) for k in admin.scan_iter(count=1000) if admin.type(k) == b"string"}


def scenario_s(contender: Contender, params: Params, run: int) -> Result:
    """A holder's lease ends, a successor takes the lock, then the stale holder releases:
    is that release refused, and is the successor's lock left as it was?"""
    del params
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        stale_client, next_client = make_client(server.url), make_client(server.url)
        key = f"bench:s:{run}"
        try:
            stale = contender.factory(stale_client, key, 0.2)
            successor = contender.factory(next_client, key, 2.0)
            if not stale.acquire(5.0):
                return {"status": "first holder could not acquire a free lock"}
            t0 = time.monotonic()
            if not successor.acquire(10.0):
                return {"status": "successor never acquired after the lease ended"}
            took_over_ms = (time.monotonic() - t0) * 1000
            before = _string_keys(admin)
            try:
                stale.release()
                refused = "no: the stale release went through"
            except Exception as exc:
                refused = f"yes ({type(exc).__name__})"
            after = _string_keys(admin)
            kept = "yes" if before and before == after else "NO: the successor's key changed"
            try:
                successor.release()
                successor_released = "yes"
            except Exception as exc:
                successor_released = f"NO ({type(exc).__name__})"
        finally:
            for client in (admin, stale_client, next_client):
                client.close()
    return {
        "status": "ok",
        "refused": refused,
        "kept": kept,
        "successor_released": successor_released,
        "took_over_ms": took_over_ms,
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
    "S": scenario_s,
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
    for name in b_names():
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
    for name in b_names():
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


def fairness_of(runs: list[Result], field: str) -> float:
    """Median over runs of one figure of the head-of-line analysis (``fairness``)."""
    return median_of([r.get("fairness") or {} for r in runs], field)


def table_b_fair(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario B: head-of-line waits, and the eventual-fairness check (benchmarks.fairness)."""
    header = ["lock", "fair_after ms (0: FIFO check)", "head wait p50 ms", "p99 ms", "max ms"]
    header += ["max beyond fair_after ms", "waiters overtaken after their due release"]
    header += ["most holds in between", "holds"]
    rows = []
    for name in b_names():
        runs = [r for r in results.get(name, []) if r.get("fairness")]
        if name in na or not runs:
            continue
        worst = [r["fairness"] for r in runs]
        rows.append(
            [
                name,
                fmt(median_of(runs, "fair_ms"), 0),
                fmt(fairness_of(runs, "head_p50_ms"), 2),
                fmt(fairness_of(runs, "head_p99_ms"), 2),
                fmt(max(f["head_max_ms"] for f in worst), 2),
                fmt(max(f["over_ms"] for f in worst), 2),
                f"{sum(f['violations'] for f in worst)} of {sum(f['holds'] for f in worst)}",
                str(max(f["jumped_max"] for f in worst)),
                fmt(median_of(worst, "holds"), 0),
            ]
        )
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


def _csl_script_names() -> dict[str, str]:
    """Our scripts' SHA1 -> name, to label EVALSHA requests."""
    try:
        from celery_singleton_lock.engine.scripts import SCRIPTS  # noqa: PLC0415
    except Exception:
        return {}
    return {script.sha: name.upper() for name, script in SCRIPTS.items()}


def request_label(request: str, names: dict[str, str]) -> str:
    """``EVALSHA:<sha>`` as ``EVALSHA RELEASE`` for our scripts, ``EVALSHA`` for others."""
    if request.startswith("EVALSHA:"):
        name = names.get(request.removeprefix("EVALSHA:"))
        return f"EVALSHA {name}" if name else "EVALSHA"
    return request


def e_points(runs: list[Result]) -> dict[int, list[Result]]:
    """Scenario E results of one configuration, grouped by waiter count."""
    points: dict[int, list[Result]] = {}
    for result in runs:
        if "n" in result:
            points.setdefault(int(result["n"]), []).append(result)
    return dict(sorted(points.items()))


def table_e(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Scenario E table: one row per configuration and waiter count."""
    header = ["lock", "waiters", "commands/hand-off", "round trips/hand-off", "polls/hand-off"]
    header += ["hand-off p50 ms", "p99 ms", "server CPU µs/hand-off", "drain s", "status"]
    rows = []
    for name in E_WAITING:
        if name in na:
            rows.append([name, "", "N/A", "", "", "", "", "", "", na[name]])
            continue
        for n, runs in e_points(results.get(name, [])).items():
            rows.append(
                [
                    name,
                    f"{n:,}",
                    fmt(median_of(runs, "commands"), 2),
                    fmt(median_of(runs, "round_trips"), 2),
                    fmt(median_of(runs, "polls"), 2),
                    fmt(median_of(runs, "p50_ms"), 2),
                    fmt(median_of(runs, "p99_ms"), 2),
                    fmt(median_of(runs, "server_cpu_us")),
                    fmt(median_of(runs, "drain_s"), 2),
                    status_of(runs),
                ]
            )
    for name, why in E_LEFT_OUT.items():
        rows.append([name, "", "N/A", "", "", "", "", "", "", why])
    return header, rows


def _breakdown(runs: list[Result], field: str, label: Callable[[str], str]) -> str:
    """Median per-hand-off count of each command over runs, as ``name 1.00, ...``."""
    merged: dict[str, list[float]] = {}
    for result in runs:
        per: dict[str, float] = {}
        for command, value in result.get(field, {}).items():
            per[label(command)] = per.get(label(command), 0.0) + value
        for command, value in per.items():
            merged.setdefault(command, []).append(value)
    parts = []
    for command in sorted(merged):
        values = merged[command] + [0.0] * (len(runs) - len(merged[command]))
        value = statistics.median(values)
        if value >= 0.005:
            parts.append(f"{command} {value:.2f}")
    return ", ".join(parts)


def table_e_breakdown(results: dict[str, list[Result]]) -> Table:
    """Scenario E at its smallest and largest waiter counts: commands and requests by name."""
    names = _csl_script_names()
    header = ["lock", "waiters", "server commands per hand-off (in-script included)"]
    header += ["client requests per hand-off"]
    rows = []
    for name in E_WAITING:
        points = e_points(results.get(name, []))
        measured = [n for n, runs in points.items() if status_of(runs) == "ok"]
        for n in sorted({min(measured), max(measured)}) if measured else []:
            runs = points[n]
            rows.append(
                [
                    name,
                    f"{n:,}",
                    _breakdown(runs, "breakdown", str),
                    _breakdown(runs, "requests", lambda r: request_label(r, names)),
                ]
            )
    return header, rows


def table_s(results: dict[str, list[Result]], na: dict[str, str]) -> Table:
    """Safety probe table."""
    header = ["lock", "stale holder's release refused", "successor's lock untouched"]
    header += ["successor then releases", "runs", "status"]
    rows = []
    for name in CONTENDERS:
        if name in na:
            rows.append([name, "N/A", "", "", "", na[name]])
            continue
        runs = results.get(name, [])
        ok = [r for r in runs if r.get("status") == "ok"]

        def verdict(field: str, results: list[Result] = ok) -> str:
            values = sorted({str(r[field]) for r in results})
            return " / ".join(values) if values else "—"

        rows.append(
            [
                name,
                verdict("refused"),
                verdict("kept"),
                verdict("successor_released"),
                str(len(runs)),
                status_of(runs),
            ]
        )
    return header, rows


def _flat(values: Sequence[float]) -> tuple[float, float]:
    """(max / min, max - min) of positive values; NaN when there are none."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean or min(clean) <= 0:
        return float("nan"), float("nan")
    return max(clean) / min(clean), max(clean) - min(clean)


def targets(results: dict[str, dict[str, list[Result]]], who: str = "csl") -> list[str]:
    """Issue 13's lock-engine targets for ``who``, each marked met / MISSED / not measured."""

    def get(scenario: str, name: str, field: str) -> float:
        return median_of(results.get(scenario, {}).get(name, []), field)

    def line(text: str, values: Sequence[float], ok: Callable[[], bool]) -> str:
        measured = bool(values) and not any(math.isnan(v) for v in values)
        return f"- {text} -> {('met' if ok() else 'MISSED') if measured else 'not measured'}"

    cmds, x_floor = get("A", who, "commands"), get("A", who, "x_floor")
    floor_us, us = get("A", "floor", "median_us"), get("A", who, "median_us")
    b = results.get("B", {})
    lost_runs = [r["lost"] for r in b.get(who, []) if "lost" in r]
    lost = float(max(lost_runs)) if lost_runs else float("nan")
    x_prl = paired(b.get(who, []), b.get("python-redis-lock", []), "throughput")
    x_p99 = paired(b.get(who, []), b.get("python-redis-lock", []), "wait_p99_ms")
    cs, prl_cs = get("B", who, "throughput"), get("B", "python-redis-lock", "throughput")
    p99, prl99 = get("B", who, "wait_p99_ms"), get("B", "python-redis-lock", "wait_p99_ms")
    p50, c99 = get("C", who, "p50_ms"), get("C", who, "p99_ms")
    out = [
        line(
            f"A. uncontended acquire+release <= 1.05x the SET NX PX floor and <= 4 server "
            f"commands per pair: {fmt(us)} vs {fmt(floor_us)} µs, {times(x_floor)} floor "
            f"(paired), {fmt(cmds, 2)} commands",
            [x_floor, cmds],
            lambda: x_floor <= 1.05 and cmds <= 4,
        ),
        line(
            f"B. contended CS/s with 100 clients >= 1.3x python-redis-lock: {fmt(cs, 0)} vs "
            f"{fmt(prl_cs, 0)} CS/s, {times(x_prl)} (median of per-run ratios)",
            [x_prl],
            lambda: x_prl >= 1.3,
        ),
        line(
            f"B. wait p99 <= 0.5x python-redis-lock's: {fmt(p99)} vs {fmt(prl99)} ms, "
            f"{times(x_p99)} (median of per-run ratios)",
            [x_p99],
            lambda: x_p99 <= 0.5,
        ),
        line(
            f"C. hand-off p50 <= 0.9 ms and p99 <= 1.3 ms: {fmt(p50, 2)} / {fmt(c99, 2)} ms",
            [p50, c99],
            lambda: p50 <= 0.9 and c99 <= 1.3,
        ),
    ]
    for name in ("csl fallback_poll=30", who):
        points = e_points(results.get("E", {}).get(name, []))
        ok = {n: median_of(runs, "commands") for n, runs in points.items()
              if status_of(runs) == "ok"}  # fmt: skip
        spread, _ = _flat(list(ok.values()))
        span = f"N = {min(ok):,}..{max(ok):,}" if ok else "no N measured"
        curve = ", ".join(f"{n:,}: {fmt(v, 2)}" for n, v in ok.items())
        full = bool(ok) and min(ok) <= 10 and max(ok) >= 1000
        out.append(
            line(
                f"E. `{name}`: commands per hand-off constant from 10 to 1,000 waiters "
                f"(max/min over N <= 1.10): {curve}; max/min {fmt(spread, 2)} ({span})",
                [spread if full else float("nan")],
                lambda spread=spread: spread <= 1.10,
            )
        )
    safety = results.get("S", {}).get(who, [])
    refused = [r for r in safety if r.get("status") == "ok"]
    stale_ok = float(bool(refused) and all(str(r["refused"]).startswith("yes") for r in refused))
    kept_ok = float(bool(refused) and all(r["kept"] == "yes" for r in refused))
    out += [
        line(f"Safety. 0 lost updates (B, worst run): {fmt(lost, 0)}", [lost], lambda: lost == 0),
        line(
            f"Safety. the stale release refused (S, {len(refused)} probes)",
            [stale_ok if refused else float("nan")],
            lambda: stale_ok == 1.0,
        ),
        line(
            f"Safety. successor never deleted (S, {len(refused)} probes)",
            [kept_ok if refused else float("nan")],
            lambda: kept_ok == 1.0,
        ),
    ]
    return out


TABLES: dict[str, tuple[str, Callable[[dict[str, list[Result]], dict[str, str]], Table]]] = {
    "A": ("A. Uncontended acquire+release, one client", table_a),
    "B": ("B. Flash sale: 100 clients (10 processes x 10 threads), one lock", table_b),
    "C": ("C. Hand-off latency: holder's release → blocked waiter's acquire", table_c),
    "D": ("D. SIGKILLed holder (lease 1 s): waiter's acquire after lease expiry", table_d),
    "E": ("E. Waiters scaling: N waiters blocked on one lock, released one by one", table_e),
    "S": ("S. Safety probe: a stale holder releases after its successor took over", table_s),
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
    "E": (
        "N waiters ({e_waiters_text}; threads spread over {e_procs} processes, each thread with "
        "its own connection, {e_lease:g} s leases) block on one lock that this process holds; "
        "each starts waiting at a random instant within {e_stagger:g} s (so the waiters' poll "
        "timers are not in step). Once all N are waiting (ours: N in the queue, `ZCARD "
        "<base>queue`, and N clients blocked, `INFO clients`; python-redis-lock: N blocked; "
        "redis-py, which polls: 0.3 s after the last one started) INFO commandstats is reset and "
        "the lock released; each waiter takes the lock, releases it at once and exits. That is N "
        "hand-offs (the holder's release to the first waiter, then each waiter's to the next), "
        "plus one last release with nobody waiting, spread over the N. Per hand-off: commands = "
        "INFO commandstats delta (in-script included) / N; round trips = requests the holder and "
        "the waiters sent after the release began (a wrapped redis-py Connection) / N. Neither "
        "counts the BLPOP each waiter was already blocked in when the lock was released (Redis "
        "counts a command when it is sent; its reply is the hand-off): add 1 per hand-off for "
        "python-redis-lock and ours alike. Polls = acquire attempts beyond what a hand-off needs "
        "(ours: every ACQUIRE after the release began, since a waiter handed the lock needs none; "
        "python-redis-lock and redis-py: SET NX attempts beyond one per waiter) / N; latency = a "
        "waiter's acquire() return - the instant just before its predecessor's release() call "
        "(CLOCK_MONOTONIC); server CPU = redis-server main-thread CPU over the drain / N. `csl` "
        "waits with the default `fallback_poll` (1 s): every waiter re-tries about once a second "
        "while it waits, so the longer the line, the more polls per hand-off; `csl "
        "fallback_poll=30` shows the hand-off alone. A configuration that does not finish within "
        "its budget ({e_budget:g} s blocking, {e_poll_budget:g} s polling) is not measured at "
        "larger N. {e_limits}"
    ),
    "S": (
        "Per run and contender, on its own server: a holder takes the lock with a 0.2 s "
        "lease (python-redis-lock: 1 s, its smallest), a second client blocks until it gets "
        "the lock after that lease ended, then the first holder calls release(). Refused = "
        "the release raised (the exception is named); untouched = every string key of the "
        "server has the same value before and after that release; then the successor "
        "releases normally."
    ),
}


FAIR_NOTE = (
    "Head-of-line waits (`benchmarks/fairness.py`): every critical section records when its "
    "client's first acquire request was written to the socket (the request that queues a "
    "waiter; a wrapped redis-py connection stamps it), when acquire() returned and when "
    "release() was called, on one CLOCK_MONOTONIC clock. Queue order = order of the first "
    "requests; a waiter becomes head when every client queued before it has acquired; head "
    "wait = its acquire - that moment. Check: once the head has waited fair_after (0 for "
    "FIFO), the first release after that must hand the lock to it; a waiter that another "
    "client's hold came in before is counted as overtaken (for a FIFO lock the count checks "
    "the reconstruction itself; python-redis-lock and redis-py barge, so theirs is large). "
    "Two clients whose first requests were in flight at once may have queued in either "
    "order: one that may have queued first and got the lock first counts as ahead (the "
    "reply to the first request is stamped too), so an overtaker surely queued later. "
    "Sums and worst values are over all runs."
)


def e_limits(results: dict[str, dict[str, list[Result]]]) -> str:
    """The server and process limits scenario E ran under."""
    import resource  # noqa: PLC0415  (Unix only, like the rest)

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    seen = {r.get("maxclients") for runs in results.get("E", {}).values() for r in runs}
    seen.discard(None)
    maxclients = ", ".join(str(v) for v in sorted(seen)) or "?"
    return f"Server `maxclients` {maxclients}; the harness's open-files limit {soft}."


def render_sections(
    results: dict[str, dict[str, list[Result]]],
    na: dict[str, str],
    params: Params,
    *,
    above: str = "",
    level: str = "###",
) -> list[str]:
    """One markdown section per scenario: title, method note, ``above`` line, tables."""
    out: list[str] = []
    fields = vars(params) | {
        "e_waiters_text": ", ".join(f"{n:,}" for n in params.e_waiters),
        "e_limits": e_limits(results),
    }
    for scenario, (title, build) in TABLES.items():
        if scenario not in results:
            continue
        out += ["", f"{level} {title}", "", NOTES[scenario].format(**fields), ""]
        if above:
            out += [above, ""]
        out.append(markdown(build(results[scenario], na)))
        if scenario == "B":
            out += ["", markdown(table_b_breakdown(results[scenario]))]
            out += ["", FAIR_NOTE, "", markdown(table_b_fair(results[scenario], na))]
        if scenario == "E":
            out += ["", markdown(table_e_breakdown(results[scenario]))]
    return out


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
    out += render_sections(results, na, params)
    if "csl" not in na:
        out += ["", "### Targets for `csl` (from issue 13)", "", *targets(results)]
    return "\n".join(out)


def run_lock(
    params: Params,
    scenarios: str,
    chosen: Sequence[str],
    progress: Callable[[str, float], None],
) -> tuple[dict[str, dict[str, list[Result]]], dict[str, str]]:
    """Run ``scenarios`` for the ``chosen`` contenders: (results, not-available reasons)."""
    na = {c.name: why for c in CONTENDERS.values() if (why := c.unavailable())}
    na.update({name: "not selected" for name in CONTENDERS if name not in chosen})
    for name in E_WAITING:
        if name not in CONTENDERS and "csl" in na:  # our variants of E follow csl
            na[name] = na["csl"]
    runnable = [c for c in CONTENDERS.values() if c.name not in na]
    for name in FAIR_CONTENDERS:  # scenario B's fair_after variants follow csl
        if "csl" in na:
            na[name] = na["csl"]
        elif name not in chosen and "csl" not in chosen:
            na[name] = "not selected"
    fair = [c for c in FAIR_CONTENDERS.values() if c.name not in na]
    results: dict[str, dict[str, list[Result]]] = {}
    for scenario in scenarios:
        if scenario == "E":
            results["E"] = {}
            for run in range(params.runs):
                live = [name for name in E_WAITING if name not in na]
                for name, runs in scenario_e(params, run, live, progress).items():
                    results["E"].setdefault(name, []).extend(runs)
            continue
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
            pool = runnable + (fair if scenario == "B" else [])
            order = random.Random(5000 + run).sample(pool, len(pool))
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
    return results, na


SCENARIOS = "ABCDES"


def parse_waiters(text: str) -> tuple[int, ...]:
    """``10,100,1000`` -> (10, 100, 1000)."""
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lock", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations: a smoke check")
    parser.add_argument("--runs", type=int, help="runs per scenario (default 3, quick 1)")
    parser.add_argument("--json", metavar="PATH", help="also write raw results as JSON")
    parser.add_argument("--scenarios", default=SCENARIOS, help="subset to run, e.g. AB")
    parser.add_argument("--contenders", help="comma-separated subset of: " + ", ".join(CONTENDERS))
    parser.add_argument("--waiters", type=parse_waiters,
                        help="scenario E's waiter counts, e.g. 10,100,1000")  # fmt: skip
    args = parser.parse_args(argv)
    params = Params.build(args.quick, args.runs, args.waiters)
    chosen = args.contenders.split(",") if args.contenders else list(CONTENDERS)
    unknown = set(chosen) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    scenarios = "".join(s for s in args.scenarios.upper() if s in SCENARIOS)
    info = machine_info()
    started = time.monotonic()

    def progress(text: str, t0: float) -> None:
        elapsed = f"[{time.monotonic() - started:6.1f}s]"
        print(f"{elapsed} {text} ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    results, na = run_lock(params, scenarios, chosen, progress)
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

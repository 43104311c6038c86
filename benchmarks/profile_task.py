"""Where a locked task's time goes (issue 24): a profile of real workers draining tasks.

Run ``python -m benchmarks.profile_task [--tasks 3000] [--kinds csl-run,...]``.

For each of the plain task, the floor contender, ours in run scope and ours in queue scope:
two private redis-servers (broker; locks), the producer (this process) publishes
``--tasks`` trivial tasks under ``cProfile``, then a fresh ``celery worker`` (prefork,
concurrency 2, the app ``benchmarks.celery_app_more`` with ``CSL_BENCH_PROFILE`` set)
drains them with every pool process under ``cProfile`` (``benchmarks.celery_app_more``
starts each process's profile afresh after its first 10 tasks, which open connections and
load scripts, and writes it every 100 tasks; the figures are per task of what the profiles
cover). The lock server's ``INFO commandstats`` (``usec`` per command, Lua-internal
commands included) gives the time Redis spends per task.

Per task, the profiled time is split by the *own* time (cProfile ``tottime``) of each
function, grouped by where the function lives (``GROUPS``), so the groups add up to the
whole; cProfile's own overhead inflates Python-heavy groups alike for every task kind, so
read the differences to the plain task. A second table lists our functions by inclusive
time per task.

Issue 32's figure, "our own Python per task in the pool", is measured two ways and
``targets32`` judges both. The first (``sampled``, ``ours_cpu_us``) comes from a second
drain of ours (run and queue scope, ``--sample-tasks``) with each pool process under a
CPU-time sampler instead of cProfile (``celery_app_more.Sampler``: ``SIGPROF`` after every
period of the process's CPU time, each signal counting the Python function running when
it is handled). Self-time attribution: the CPU time of the samples that fell in functions
defined in ``celery_singleton_lock/``; a built-in counts in the Python function that
called it; what our code calls in redis-py, the socket, kombu, billiard or Celery is not
in it. A sample stands for the CPU time the dumps cover divided by their samples; the
standard error is the Poisson one of our samples. Why not cProfile's own time alone:
cProfile adds a cost to every call, and its clock runs while the process waits for a CPU,
so on a busy 2-CPU machine (the worker's main process, two pool processes and Redis
already share it) the same code measures several times slower. The second is cProfile's,
from the first drain: the own time (``tottime``) of our functions (``ours_self_us``, what
the issue's 360 µs was), and beside it the own time of built-ins and standard-library
functions on calls from our frames (``ours_callees_us``, from cProfile's per-caller
records), the calls into our functions per task (``ours_calls``, a count that does not
depend on the machine's speed or load) and every one of our functions with its calls and
times (``ours_functions``; the section lists the 15 with the most sampled CPU,
``top_table``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks.bench_celery import cpu_seconds
from benchmarks.bench_lock import server_cpu_us
from benchmarks.bench_memory import app_module, publish, wait_ended, worker_on
from celery_singleton_lock.testing import RedisServer

Result = dict[str, Any]
Log = Callable[[str], None]
KINDS = (
    ("plain", "plain `Task`"),
    ("floor", "floor (`SET NX PX` + Lua delete)"),
    ("csl-run", "ours, run scope"),
    ("csl-queue", "ours, queue scope"),
)
#: Where our code lives (a path fragment of a profiled function's file).
OURS = "celery_singleton_lock/"
#: How many of our functions ``ours_top`` keeps.
TOP = 15
#: The kinds the sampler measures too (the others run none of our code in the pool).
SAMPLED = ("csl-run", "csl-queue")

#: (group, test on (file, function name)), first match wins; the last group takes the rest.
IDLE = "idle: waiting for the next task (`posix.read` of the pool's job pipe)"
GROUPS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    (IDLE, lambda f, n: f == "~" and "posix.read" in n),
    (
        "socket I/O: waiting for Redis replies, writing requests (`recv`, `sendall`, ...)",
        lambda f, n: (
            f == "~"
            and any(
                w in n for w in ("recv", "send", "select", "poll", "epoll", "connect", "settimeout")
            )
        ),
    ),
    ("ours: key building (`keys.py`)", lambda f, n: "celery_singleton_lock/keys" in f),
    (
        "ours: value building (`engine/value.py`, `engine/wire.py`)",
        lambda f, n: (
            "celery_singleton_lock/engine/value" in f or "celery_singleton_lock/engine/wire" in f
        ),
    ),
    (
        "ours: hold registry and renewer (`engine/holds.py`, `engine/renewal.py`)",
        lambda f, n: (
            "celery_singleton_lock/engine/holds" in f or "celery_singleton_lock/engine/renewal" in f
        ),
    ),
    (
        "ours: options and config (`options.py`, `config.py`)",
        lambda f, n: "celery_singleton_lock/options" in f or "celery_singleton_lock/config" in f,
    ),
    (
        "ours: runtime pipeline and signal receivers (`runtime/`, `signals.py`, `task.py`)",
        lambda f, n: any(
            p in f
            for p in (
                "celery_singleton_lock/runtime",
                "celery_singleton_lock/signals",
                "celery_singleton_lock/task",
            )
        ),
    ),
    (
        "ours: lock engine and modes (rest of `engine/`, `modes/`, others)",
        lambda f, n: "celery_singleton_lock/" in f,
    ),
    ("redis-py (command packing, reply parsing, connection pool)", lambda f, n: "/redis/" in f),
    ("Celery signal dispatch (`Signal.send`)", lambda f, n: "celery/utils/dispatch" in f),
    ("Celery tracer, request, app (`celery/`)", lambda f, n: "/celery/" in f),
    (
        "kombu, billiard, amqp (messaging, pool IPC)",
        lambda f, n: any(p in f for p in ("/kombu/", "/billiard/", "/amqp/", "/vine/")),
    ),
    ("benchmark harness (progress slots, profiler dumps)", lambda f, n: "/benchmarks/" in f),
    ("Python stdlib and built-ins", lambda f, n: True),
)


def group_of(file: str, name: str) -> str:
    """The group of a function (``GROUPS``)."""
    for group, test in GROUPS:
        if test(file, name):
            return group
    return GROUPS[-1][0]


def split(stats: pstats.Stats, tasks: int) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """(µs of own time per task by group, our functions by inclusive µs per task)."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    groups: dict[str, float] = {}
    ours: list[tuple[str, float]] = []
    for (file, line, name), (_cc, _nc, tt, ct, _callers) in raw.items():
        group = group_of(file, name)
        groups[group] = groups.get(group, 0.0) + tt * 1e6 / tasks
        if OURS in file:
            short = file.split(OURS, 1)[1]
            ours.append((f"`{short}:{line}` {name}", ct * 1e6 / tasks))
    ours.sort(key=lambda item: -item[1])
    return groups, ours


#: Groups whose functions, called from our frames, count as "called by our code" in
#: ``ours_callees_us``: built-ins and the standard library (not socket I/O, not the
#: libraries our code talks to, which issue 32 leaves out).
CALLEE_GROUPS = frozenset({GROUPS[-1][0]})


def own_python(stats: pstats.Stats, tasks: int, top: int = TOP) -> Result:
    """cProfile's side of issue 32's "our own Python per task", from a profile covering
    ``tasks`` tasks: ``ours_self_us`` (own time of our functions), ``ours_calls`` (calls
    into them), ``ours_callees_us`` (own time of built-ins and standard-library functions
    on calls made from our frames), ``ours_functions`` (every one of our functions, with
    calls, own µs and inclusive µs per task and own µs per call) and ``ours_top`` (the
    ``top`` of them by own time). The judged figure is the sampler's (``sampled``)."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    self_s = calls = callees_s = 0.0
    functions: list[Result] = []
    for (file, line, name), (_cc, nc, tt, ct, callers) in raw.items():
        if OURS in file:
            self_s += tt
            calls += nc
            functions.append({
                "function": f"{file.split(OURS, 1)[1]}:{line} {name}",
                "calls": nc / tasks,
                "self_us": tt * 1e6 / tasks,
                "per_call_us": tt * 1e6 / nc if nc else 0.0,
                "cum_us": ct * 1e6 / tasks,
            })  # fmt: skip
        elif group_of(file, name) in CALLEE_GROUPS:
            # Per-caller records are (calls, primitive calls, own time, inclusive time).
            callees_s += sum(edge[2] for caller, edge in callers.items() if OURS in caller[0])
    functions.sort(key=lambda f: -float(f["self_us"]))
    return {
        "ours_self_us": self_s * 1e6 / tasks,
        "ours_calls": calls / tasks,
        "ours_callees_us": callees_s * 1e6 / tasks,
        "ours_top": functions[:top],
        "ours_functions": functions,
    }


def redis_usec(admin: redis.Redis, tasks: int) -> dict[str, float]:
    """Lock-server µs per task by command (INFO commandstats ``usec``; a script's time
    includes the commands it runs, which are also listed on their own)."""
    by: dict[str, float] = {}
    for key, value in admin.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name.split("|", 1)[0] in ("info", "config", "flushall", "ping", "client", "hello"):
            continue
        by[name] = float(value["usec"]) / tasks
    return dict(sorted(by.items(), key=lambda kv: -kv[1]))


def profile_kind(
    kind: str, tasks: int, servers: tuple[RedisServer, RedisServer], tmp: Path, log: Log
) -> Result:
    """Producer and pool-process profiles and lock-server time for one task kind."""
    broker, lock = servers
    module = app_module(broker, lock)
    admin = redis.Redis.from_url(lock.url)
    admin.flushall()
    publish(module, kind, 10_000_000, 20)  # warm-up publish: connections, scripts
    admin.config_resetstat()
    cpu0 = server_cpu_us(admin)
    producer = cProfile.Profile()
    producer.enable()
    publish(module, kind, 0, tasks)
    producer.disable()
    cpu1 = server_cpu_us(admin)
    admin.config_resetstat()
    profiles = tmp / f"profiles-{kind}"
    profiles.mkdir()
    env = {"CSL_BENCH_PROFILE": str(profiles)}
    with worker_on(broker, lock, tmp, f"prof-{kind}", extra_env=env) as (worker, progress):
        status = wait_ended(module, progress, worker, tasks + 20)
        ready = float((progress / "ready").read_text() or 0)
        main_us = (cpu_seconds(worker.pid) - ready) * 1e6 / (tasks + 20)
        cpu2 = server_cpu_us(admin)
        time.sleep(0.3)
    by_command = redis_usec(admin, tasks + 20)
    drain_usec = (cpu2 - cpu1) / (tasks + 20)
    publish_usec = (cpu1 - cpu0) / tasks
    admin.close()
    dumps = sorted(profiles.glob("prof-*.pstats"))
    covered = sum(int(p.with_suffix(".count").read_text()) for p in dumps)
    if not dumps or not covered:
        return {"status": status if status != "ok" else "no profile written"}
    pool = pstats.Stats(*(str(p) for p in dumps))
    groups, ours = split(pool, covered)
    own = own_python(pool, covered)
    producer_groups, producer_ours = split(pstats.Stats(producer), tasks)
    busy = sum(v for g, v in groups.items() if g != IDLE)
    log(
        f"profile {kind}: {busy:.0f} µs/task busy in the pool ({covered} tasks), "
        f"{drain_usec:.1f} µs/task in the lock server, our own Python "
        f"{own['ours_self_us']:.0f} µs/task ({own['ours_calls']:.1f} calls)"
    )
    return {
        "status": status,
        **own,
        "tasks_profiled": covered,
        "pool": groups,
        "pool_ours": ours[:12],
        "producer": producer_groups,
        "producer_ours": producer_ours[:8],
        "main_us": main_us,
        "redis_drain_us": drain_usec,
        "redis_publish_us": publish_usec,
        "redis_by_command": by_command,
    }


def sampled(dumps: Sequence[Result]) -> Result:
    """Issue 32's judged figure from the sampler's dumps (``celery_app_more.Sampler``, one
    per pool process): every sample stands for the CPU time the dumps cover divided by their
    samples; ``ours_cpu_us`` is our functions' samples in those units per task, with its
    Poisson standard error (``ours_cpu_err_us``); ``ours_cpu_by_function`` per function."""
    tasks, cpu_s, total, ours = 0, 0.0, 0, 0
    by: Counter[str] = Counter()
    for dump in dumps:
        tasks += int(dump["tasks"])
        cpu_s += float(dump["cpu_s"])
        for file, line, name, count in dump["samples"]:
            total += count
            if OURS in file:
                ours += count
                by[f"{file.split(OURS, 1)[1]}:{line} {name}"] += count
    if not total or not tasks:
        return {"status": "no samples"}
    unit = cpu_s * 1e6 / total / tasks  # µs per task that one sample stands for
    return {
        "status": "ok",
        "tasks_sampled": tasks,
        "samples": total,
        "ours_samples": ours,
        "pool_cpu_us": cpu_s * 1e6 / tasks,
        "ours_cpu_us": ours * unit,
        "ours_cpu_err_us": math.sqrt(ours) * unit,
        "ours_cpu_by_function": {f: n * unit for f, n in by.most_common()},
    }


def sample_kind(
    kind: str, tasks: int, servers: tuple[RedisServer, RedisServer], tmp: Path
) -> Result:
    """A second drain of ``tasks`` tasks of ``kind`` with the pool processes under the
    CPU-time sampler (no cProfile): ``sampled`` of their dumps."""
    broker, lock = servers
    module = app_module(broker, lock)
    admin = redis.Redis.from_url(lock.url)
    admin.flushall()
    admin.close()
    publish(module, kind, 20_000_000, tasks)
    directory = tmp / f"samples-{kind}"
    directory.mkdir()
    env = {"CSL_BENCH_PROFILE": str(directory), "CSL_BENCH_PROFILE_MODE": "sample"}
    with worker_on(broker, lock, tmp, f"sample-{kind}", extra_env=env) as (worker, progress):
        status = wait_ended(module, progress, worker, tasks)
        time.sleep(0.3)  # the last dump is written after the last task counted as ended
    paths = sorted(directory.glob("sample-*.json"))
    result = sampled([json.loads(p.read_text(encoding="utf-8")) for p in paths])
    if status != "ok":
        result["status"] = status
    return result


def run_profile(
    tasks: int,
    log: Log,
    keep: Path | None = None,
    kinds: Sequence[str] | None = None,
    sample_tasks: int = 0,
) -> dict[str, Result]:
    """Every kind of ``KINDS`` (or of ``kinds``) on one pair of servers (the app reads their
    URLs once per process: run this in a process of its own), and for ``SAMPLED`` kinds a
    drain of ``sample_tasks`` under the sampler; failures are reported, not raised. With
    ``keep`` the profiles are written there and kept."""
    out: dict[str, Result] = {}
    with (
        RedisServer() as broker,
        RedisServer() as lock,
        tempfile.TemporaryDirectory(prefix="csl-prof-") as tmp_name,
    ):
        tmp = keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for kind, _ in KINDS:
            if kinds is not None and kind not in kinds:
                continue
            try:
                out[kind] = profile_kind(kind, tasks, (broker, lock), tmp, log)
            except Exception as exc:
                out[kind] = {"status": f"error: {type(exc).__name__}: {exc}"}
            if sample_tasks and kind in SAMPLED:
                try:
                    found = sample_kind(kind, sample_tasks, (broker, lock), tmp)
                except Exception as exc:
                    found = {"status": f"error: {type(exc).__name__}: {exc}"}
                out[kind]["sampled"] = found
                if found.get("status") == "ok":
                    log(
                        f"sampled {kind}: our own Python {found['ours_cpu_us']:.0f} "
                        f"± {found['ours_cpu_err_us']:.0f} µs/task CPU of "
                        f"{found['pool_cpu_us']:.0f} in the pool ({found['tasks_sampled']} "
                        f"tasks, {found['samples']} samples)"
                    )
    return out


def section(
    results: dict[str, Result], tasks: int, above: str = "", sample_tasks: int = 0
) -> list[str]:
    """The markdown section "Where a locked task's time goes"."""
    kinds = [(k, label) for k, label in KINDS if (results.get(k) or {}).get("pool")]
    out = [
        "## Where a locked task's time goes",
        "",
        f"`python -m benchmarks.profile_task --tasks {tasks} --sample-tasks {sample_tasks}` "
        "(run by `benchmarks.run`): per "
        "task kind, the producer publishes the tasks under `cProfile`, then a fresh worker "
        "(prefork, concurrency 2) drains them with each pool process under `cProfile`; the "
        "lock server's `INFO cpu` and `INFO commandstats` give Redis's own time, `/proc` the "
        "worker main process's CPU. Own time (`tottime`) of "
        "every function, grouped by where it lives, in µs per task: the groups add up to "
        "the profiled total. cProfile slows Python code (roughly 1.5-2x) alike for every "
        "kind: compare the columns, not the absolute figures with the drain rates above. "
        "The worker's main process runs no lock code in these scopes (it consumes, acks and "
        "feeds the pool). No result backend is "
        "configured (`ignore_result=True`), so no result store appears.",
        "",
    ]
    if above:
        out += [above, ""]
    if not kinds:
        return [
            *out,
            "Not measured: "
            + "; ".join(f"{k}: {(results.get(k) or {}).get('status')}" for k, _ in KINDS),
        ]
    header = "| pool process, µs per task | " + " | ".join(label for _, label in kinds)
    if "plain" in dict(kinds):
        header += " | " + " | ".join(f"{label} − plain" for k, label in kinds if k != "plain")
    out += [header + " |", "|---|" + "---:|" * (header.count("|") - 1)]
    plain = results.get("plain", {}).get("pool", {}) if "plain" in dict(kinds) else None
    for group, _ in (*GROUPS, ("total", None)):

        def value(kind: str, group: str = group) -> float:
            pool = results[kind]["pool"]
            if group == "total":  # busy time: the wait for the next task left out
                return float(sum(v for g, v in pool.items() if g != IDLE))
            return float(pool.get(group, 0.0))

        cells = [f"{value(k):.0f}" for k, _ in kinds]
        if plain is not None:
            cells += [f"{value(k) - value('plain'):+.0f}" for k, _ in kinds if k != "plain"]
        name = "**total (busy: idle left out)**" if group == "total" else group
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "| other processes, CPU µs per task | " + " | ".join(label for _, label in kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    out.append(
        "| worker main process (not profiled; `/proc` CPU time from `worker_ready` on) | "
        + " | ".join(f"{results[k]['main_us']:.0f}" for k, _ in kinds)
        + " |"
    )
    out.append(
        "| lock server at publish (`INFO cpu`, main thread) | "
        + " | ".join(f"{results[k]['redis_publish_us']:.1f}" for k, _ in kinds)
        + " |"
    )
    out.append(
        "| lock server at drain (`INFO cpu`, main thread) | "
        + " | ".join(f"{results[k]['redis_drain_us']:.1f}" for k, _ in kinds)
        + " |"
    )
    out += ["", *own_python_table(results, kinds)]
    for kind in ("csl-run", "csl-queue"):
        if kind in dict(kinds):
            out += ["", *top_table(results[kind], dict(kinds)[kind])]
    for kind, label in kinds:
        if kind == "plain":
            continue
        by = results[kind]["redis_by_command"]
        top = ", ".join(f"{c} {v:.2f}" for c, v in list(by.items())[:8] if v >= 0.01)
        out.append(
            f"\nLock server at drain, {label}, µs per task by command (`INFO commandstats` "
            f"usec; a script's time includes the commands it runs, listed too): {top}."
        )
        ours = results[kind]["pool_ours"][:8]
        if ours:
            out.append(
                f"Ours by inclusive time in the pool, µs per task ({label}): "
                + "; ".join(f"{name} {value:.0f}" for name, value in ours)
                + "."
            )
        if kind == "csl-queue":
            prod = results[kind]["producer"]
            plain_prod = results.get("plain", {}).get("producer", {})
            extra = sum(prod.values()) - sum(plain_prod.values())
            out.append(
                f"Producer (publish) of {label}: {sum(prod.values()):.0f} µs per task "
                f"profiled ({extra:+.0f} against plain); ours by inclusive time: "
                + "; ".join(f"{n} {v:.0f}" for n, v in results[kind]["producer_ours"][:5])
                + "."
            )
    return out


def own_python_table(results: dict[str, Result], kinds: Sequence[tuple[str, str]]) -> list[str]:
    """Issue 32's "our own Python per task in the pool", per kind: the sampled CPU and
    cProfile's own time (both judged), cProfile's calls, and what our frames call in
    built-ins and the standard library."""

    def cells(field: str, digits: int) -> str:
        return " | ".join(_fmt(results[k].get(field), digits) for k, _ in kinds)

    def sampled_cells(field: str, digits: int, err: str | None = None) -> str:
        out = []
        for k, _ in kinds:
            found = results[k].get("sampled") or {}
            text = _fmt(found.get(field), digits)
            if err and found.get(err) is not None:
                text += f" ± {_fmt(found[err], digits)}"
            out.append(text)
        return " | ".join(out)

    return [
        "Our own Python per task in the pool (issue 32), judged two ways. First, the CPU "
        "time in functions of `celery_singleton_lock/`, from a second drain of the same "
        "kind with each pool "
        "process under a CPU-time sampler instead of cProfile (`SIGPROF` every "
        "`ITIMER_PROF` period of the process's CPU time, the kernel's tick; each signal "
        "counts the Python function running when it is handled, a built-in counting in "
        "the function that called it; a sample stands for the CPU time covered divided by "
        "the samples; ± is the Poisson standard error of our samples). It adds no cost per "
        "call and leaves out the time spent waiting for a CPU (a busy machine still makes "
        "the CPU time itself longer; the share of the pool process's CPU moves less). "
        "Second, from the cProfile drain, the own time (`tottime`) of our "
        "functions (what the issue's 360 µs was; cProfile's cost per call and any wait for "
        "a CPU are in it); beside them the calls into our functions (a count, the same on "
        "any machine), and the own time of built-ins and standard-library functions on "
        "calls from our frames. What our code calls in redis-py, the socket, kombu, "
        "billiard or Celery is in none of them.",
        "",
        "| our own Python, per task | " + " | ".join(label for _, label in kinds) + " |",
        "|---|" + "---:|" * len(kinds),
        "| **CPU in our functions, µs (sampler)** | "
        + sampled_cells("ours_cpu_us", 0, "ours_cpu_err_us")
        + " |",
        f"| pool process CPU, µs (sampled drain) | {sampled_cells('pool_cpu_us', 0)} |",
        f"| tasks sampled | {sampled_cells('tasks_sampled', 0)} |",
        f"| **own time of our functions under cProfile, µs** | {cells('ours_self_us', 0)} |",
        f"| calls into our functions | {cells('ours_calls', 1)} |",
        "| built-ins and standard library called from our frames under cProfile, µs | "
        f"{cells('ours_callees_us', 0)} |",
    ]


def _fmt(value: Any, digits: int) -> str:
    return f"{float(value):,.{digits}f}" if isinstance(value, int | float) else "—"


def top_table(result: Result, label: str, top: int = TOP) -> list[str]:
    """Our ``top`` functions for one kind, by the sampler's CPU time per task when the kind
    was sampled (else by cProfile's own time), with cProfile's calls and times of each."""
    cpu = (result.get("sampled") or {}).get("ours_cpu_by_function") or {}
    functions = result.get("ours_functions") or result.get("ours_top") or []
    if cpu:
        functions = sorted(functions, key=lambda f: -float(cpu.get(f["function"], 0.0)))
        order = "the sampler's CPU time"
    else:
        order = "own time under cProfile"
    functions = functions[:top]
    out = [
        f"Our functions by {order}, {label} (top {len(functions)}), with cProfile's calls "
        "and times of each:",
        "",
        "| function | calls per task | CPU µs per task (sampler) | own µs per task (cProfile) "
        "| own µs per call (cProfile) | inclusive µs per task (cProfile) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| `{f['function'].partition(' ')[0]}` `{f['function'].partition(' ')[2]}` "
        f"| {f['calls']:.2f} | {_fmt(cpu.get(f['function'], 0.0) if cpu else None, 1)} "
        f"| {f['self_us']:.1f} | {f['per_call_us']:.2f} | {f['cum_us']:.1f} |"
        for f in functions
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_task",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per kind (default 3000)")
    parser.add_argument(
        "--sample-tasks",
        type=int,
        default=5000,
        help="tasks of the sampled drain of ours, run and queue scope (default 5000; 0: none)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep", metavar="DIR", help="write and keep the raw profiles here")
    parser.add_argument(
        "--kinds", help="comma-separated subset of: " + ",".join(k for k, _ in KINDS)
    )
    args = parser.parse_args(argv)
    kinds = None
    if args.kinds:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        unknown = sorted(set(kinds) - {k for k, _ in KINDS})
        if unknown:
            parser.error(f"unknown kinds: {', '.join(unknown)}")
    results = run_profile(
        args.tasks,
        lambda text: print(text, file=sys.stderr, flush=True),
        Path(args.keep) if args.keep else None,
        kinds,
        args.sample_tasks,
    )
    print("\n".join(section(results, args.tasks, sample_tasks=args.sample_tasks)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a locked task's time goes (issue 24): a profile of real workers draining tasks.

Run ``python -m benchmarks.profile_task [--tasks 3000]``.

For each of the plain task, ours in run scope and ours in queue scope: two private
redis-servers (broker; locks), the producer (this process) publishes ``--tasks`` trivial
tasks under ``cProfile``, then a fresh ``celery worker`` (prefork, concurrency 2, the app
``benchmarks.celery_app_more`` with ``CSL_BENCH_PROFILE`` set) drains them with every pool
process under ``cProfile`` (``benchmarks.celery_app_more`` writes each process's profile
every 250 tasks; the figures are per task of what the profiles cover). The lock server's
``INFO commandstats`` (``usec`` per command, Lua-internal commands included) gives the time
Redis spends per task.

Per task, the profiled time is split by the *own* time (cProfile ``tottime``) of each
function, grouped by where the function lives (``GROUPS``), so the groups add up to the
whole; cProfile's own overhead inflates Python-heavy groups alike for every task kind, so
read the differences to the plain task. A second table lists our functions by inclusive
time per task.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
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
    ("csl-run", "ours, run scope"),
    ("csl-queue", "ours, queue scope"),
)

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
        if "celery_singleton_lock/" in file:
            short = file.split("celery_singleton_lock/", 1)[1]
            ours.append((f"`{short}:{line}` {name}", ct * 1e6 / tasks))
    ours.sort(key=lambda item: -item[1])
    return groups, ours


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
    producer_groups, producer_ours = split(pstats.Stats(producer), tasks)
    busy = sum(v for g, v in groups.items() if g != IDLE)
    log(
        f"profile {kind}: {busy:.0f} µs/task busy in the pool ({covered} tasks), "
        f"{drain_usec:.1f} µs/task in the lock server"
    )
    return {
        "status": status,
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


def run_profile(tasks: int, log: Log, keep: Path | None = None) -> dict[str, Result]:
    """Every kind of ``KINDS`` on one pair of servers (the app reads their URLs once per
    process: run this in a process of its own); failures are reported, not raised. With
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
            try:
                out[kind] = profile_kind(kind, tasks, (broker, lock), tmp, log)
            except Exception as exc:
                out[kind] = {"status": f"error: {type(exc).__name__}: {exc}"}
    return out


def section(results: dict[str, Result], tasks: int, above: str = "") -> list[str]:
    """The markdown section "Where a locked task's time goes"."""
    kinds = [(k, label) for k, label in KINDS if (results.get(k) or {}).get("pool")]
    out = [
        "## Where a locked task's time goes",
        "",
        f"`python -m benchmarks.profile_task --tasks {tasks}` (run by `benchmarks.run`): per "
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_task",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per kind (default 3000)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep", metavar="DIR", help="write and keep the raw profiles here")
    args = parser.parse_args(argv)
    results = run_profile(
        args.tasks,
        lambda text: print(text, file=sys.stderr, flush=True),
        Path(args.keep) if args.keep else None,
    )
    print("\n".join(section(results, args.tasks)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

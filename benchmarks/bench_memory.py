"""Queue-scope memory on the lock Redis (issue 24): bytes kept per finished task.

Run ``python -m benchmarks.bench_memory [--quick] [--tasks 100000]``.

Two private redis-servers (broker; locks, touched by nothing else) and one real
``celery worker`` (prefork, concurrency 2, the app ``benchmarks.celery_app_more``):

1. warm-up: 20 tasks of each measured kind, so connections, scripts and the lock server's
   own structures exist; then the baseline (``INFO memory`` ``used_memory``, ``DBSIZE``);
2. ``--tasks`` queue-scope tasks with distinct arguments (default ``lock_queue_timeout``,
   an hour) published while the worker drains them; once every one has finished (its
   ``task_postrun`` ran) and 0.5 s passed, ``used_memory`` and ``DBSIZE`` again: bytes and
   keys per finished task;
3. the lock server emptied (``FLUSHALL``) and a new baseline; ``--keep-tasks`` tasks of a
   queue-scope task with ``lock_queue_timeout=2``: bytes per task right after they finished,
   then polled until ``DBSIZE`` is back at the baseline (and 2 s passed): what is left per
   task once no redelivery can happen.

The floors: the same ``used_memory`` delta for 100,000 entries of a few shapes written
straight to a private server (key names as long as the real per-task key), to show what
any per-task key costs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from celery_singleton_lock.testing import CeleryWorker, RedisServer

ROOT = Path(__file__).resolve().parents[1]
APP_MODULE = "benchmarks.celery_app_more"
Result = dict[str, Any]
Log = Callable[[str], None]


def used_memory(admin: redis.Redis) -> int:
    """The server's ``used_memory`` (bytes)."""
    return int(admin.info("memory")["used_memory"])


def settle(admin: redis.Redis, seconds: float = 0.5) -> tuple[int, int]:
    """(used_memory, DBSIZE) after ``seconds`` of quiet."""
    time.sleep(seconds)
    return used_memory(admin), int(admin.dbsize())


# --- the floors ------------------------------------------------------------------------------


def floors(entries: int, key_len: int = 40, batch: int = 2000) -> dict[str, float]:
    """Bytes per entry of a few shapes, ``entries`` of each on a private server."""
    width = max(8, key_len)
    shapes: dict[str, Callable[[Any, int], None]] = {
        "SET key 1-byte value PX (one key per task)": lambda p, i: p.set(
            f"{i:0{width}x}", "1", px=3_600_000
        ),
        "SET key 1-byte value, no TTL": lambda p, i: p.set(f"{i:0{width}x}", "1"),
        "ZADD key <36-byte uuid> + PEXPIRE (one sorted set per task)": lambda p, i: (
            p.zadd(f"{i:0{width}x}", {str(uuid.UUID(int=i)): i}),
            p.pexpire(f"{i:0{width}x}", 3_600_000),
        ),
        "one shared ZSET, 16-byte member per task": lambda p, i: p.zadd("shared", {f"{i:016x}": i}),
        "shared SETs, 100 per key, 12-byte member per task (PEXPIRE per set)": lambda p, i: (
            p.sadd(f"b:{i // 100:0{width - 2}x}", f"{i:012x}"),
            p.pexpire(f"b:{i // 100:0{width - 2}x}", 3_600_000),
        ),
    }
    out: dict[str, float] = {}
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        for name, write in shapes.items():
            admin.flushall()
            before, _ = settle(admin, 0.2)
            pipe = admin.pipeline(transaction=False)
            for i in range(entries):
                write(pipe, i)
                if (i + 1) % batch == 0:
                    pipe.execute()
            pipe.execute()
            after, _ = settle(admin, 0.2)
            out[name] = (after - before) / entries
        admin.close()
    return out


# --- the worker ----------------------------------------------------------------------------


@contextlib.contextmanager
def worker_on(
    broker: RedisServer,
    lock: RedisServer,
    tmp: Path,
    name: str,
    *,
    extra_env: dict[str, str] | None = None,
    concurrency: int = 2,
) -> Iterator[tuple[CeleryWorker, Path]]:
    """A fresh prefork worker of ``APP_MODULE`` on the two servers, ready; stopped on exit.
    Yields it and its progress directory (see ``benchmarks.celery_app``)."""
    progress = tmp / f"progress-{name}"
    progress.mkdir()
    env = {
        "CSL_BENCH_BROKER": broker.url,
        "CSL_BENCH_LOCK": lock.url,
        "CSL_BENCH_PROGRESS": str(progress),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **(extra_env or {}),
    }
    worker = CeleryWorker(
        APP_MODULE,
        pool="prefork",
        concurrency=concurrency,
        hostname=f"{name}@%h",
        loglevel="WARNING",
        env=env,
        cwd=ROOT,
        log_path=tmp / f"worker-{name}.log",
    ).start(wait=False)
    try:
        deadline = time.monotonic() + 60
        while not (progress / "ready").exists():
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} did not start:\n{worker.tail()}")
            time.sleep(0.05)
        yield worker, progress
    finally:
        worker.stop(group=True)


def app_module(broker: RedisServer, lock: RedisServer) -> Any:
    """The producer's side of the app, on these servers."""
    os.environ["CSL_BENCH_BROKER"] = broker.url
    os.environ["CSL_BENCH_LOCK"] = lock.url
    return importlib.import_module(APP_MODULE)


def wait_ended(
    module: Any, progress: Path, worker: CeleryWorker, count: int, stall: float = 30.0
) -> str:
    """Wait until ``count`` tasks ended in this worker; ``ok`` or why not."""
    last, changed = -1, time.monotonic()
    while True:
        ended = module.read_progress(progress)[1]
        if ended >= count:
            return "ok"
        if ended != last:
            last, changed = ended, time.monotonic()
        elif time.monotonic() - changed > stall:
            return f"stalled at {ended}/{count} tasks"
        if not worker.alive():
            return f"worker exited after {ended}/{count} tasks"
        time.sleep(0.1)


def publish(module: Any, contender: str, first: int, count: int) -> None:
    task = module.app.tasks[module.TASKS[contender]]
    for i in range(first, first + count):
        task.delay(i)


def queue_memory(tasks: int, keep_tasks: int, log: Log) -> Result:
    """Steps 1-3 of the module docstring."""
    with (
        RedisServer() as broker,
        RedisServer() as lock,
        tempfile.TemporaryDirectory(prefix="csl-mem-") as tmp_name,
    ):
        module = app_module(broker, lock)
        admin = redis.Redis.from_url(lock.url)
        result: Result = {"status": "ok", "tasks": tasks, "keep_tasks": keep_tasks}
        with worker_on(broker, lock, Path(tmp_name), "mem") as (worker, progress):
            warm = 20
            publish(module, "csl-queue", 10_000_000, warm)
            publish(module, "csl-queue-keep2", 10_000_000, warm)
            status = wait_ended(module, progress, worker, 2 * warm)
            time.sleep(2.5)  # the warm-up's 2 s keep has passed
            base_mem, base_keys = settle(admin)
            t0 = time.monotonic()
            publish(module, "csl-queue", 0, tasks)
            publish_s = time.monotonic() - t0
            if status == "ok":
                status = wait_ended(module, progress, worker, 2 * warm + tasks)
            drained_s = time.monotonic() - t0
            mem, keys = settle(admin)
            sample = next(iter(admin.scan_iter(count=100)), None)
            result.update(
                base_used=base_mem,
                used=mem,
                bytes_per_task=(mem - base_mem) / tasks,
                keys_per_task=(keys - base_keys) / tasks,
                publish_s=publish_s,
                drain_s=drained_s,
                sample_key=sample.decode(errors="replace") if sample else None,
                sample_type=admin.type(sample).decode() if sample else None,
                sample_pttl_ms=int(admin.pttl(sample)) if sample else None,
            )
            log(
                f"{tasks:,} queue-scope tasks: {result['bytes_per_task']:.1f} B and "
                f"{result['keys_per_task']:.2f} keys per task ({drained_s:.0f} s)"
            )
            # 3. lock_queue_timeout=2: what is left once no redelivery can happen
            admin.flushall()
            keep_base, keep_base_keys = settle(admin)
            done = module.read_progress(progress)[1]
            publish(module, "csl-queue-keep2", 0, keep_tasks)
            if status == "ok":
                status = wait_ended(module, progress, worker, done + keep_tasks)
            ended_at = time.monotonic()
            keep_mem, _ = settle(admin, 0.2)
            while int(admin.dbsize()) > keep_base_keys and time.monotonic() - ended_at < 30:
                time.sleep(0.25)
            time.sleep(max(0.0, 2.0 - (time.monotonic() - ended_at)))
            after, after_keys = settle(admin)
            result.update(
                keep_base_used=keep_base,
                keep_bytes_per_task=(keep_mem - keep_base) / keep_tasks,
                keep_after_bytes_per_task=(after - keep_base) / keep_tasks,
                keep_after_keys=after_keys - keep_base_keys,
                keep_gone_s=time.monotonic() - ended_at,
            )
            log(
                f"{keep_tasks:,} tasks with lock_queue_timeout=2: "
                f"{result['keep_bytes_per_task']:.1f} B/task at the end, "
                f"{result['keep_after_bytes_per_task']:.1f} B/task "
                f"{result['keep_gone_s']:.1f} s later"
            )
        result["status"] = status
        admin.close()
    return result


def run_memory(quick: bool, log: Log, tasks: int | None = None) -> Result:
    """The queue-scope measurement and the floors; a failure is reported, not raised."""
    tasks = tasks or (5_000 if quick else 100_000)
    keep = max(1_000, tasks // 10)
    began = time.monotonic()
    try:
        result = queue_memory(tasks, keep, log)
    except Exception as exc:
        result = {"status": f"error: {type(exc).__name__}: {exc}", "tasks": tasks}
    key_len = len(result.get("sample_key") or "x" * 40)
    try:
        result["floors"] = floors(20_000 if quick else 100_000, key_len)
    except Exception as exc:
        result["floors_error"] = f"{type(exc).__name__}: {exc}"
    result["took_s"] = time.monotonic() - began
    return result


def section(result: Result, above: str = "") -> list[str]:
    """The markdown: method, figures, floors."""
    out = [
        "### Queue scope: lock-Redis memory per finished task",
        "",
        "Two private redis-servers (broker; locks, touched by nothing else), one `celery "
        "worker` (prefork, concurrency 2). After a warm-up, "
        f"{result.get('tasks', 0):,} queue-scope tasks with distinct arguments are published "
        "while the worker drains them; when all have finished, the lock server's `INFO "
        "memory` `used_memory` and `DBSIZE` minus the baseline, per task. Then the lock "
        f"server is emptied and {result.get('keep_tasks', 0):,} tasks of a queue-scope task "
        "with `lock_queue_timeout=2` run the same way: per task right after, and again once "
        "the keys count is back at the baseline (and 2 s passed). Floors: `used_memory` per "
        "entry of 100,000 entries of each shape written straight to a private server, key "
        "names as long as the real one (`python -m benchmarks.bench_memory`).",
        "",
    ]
    if above:
        out += [above, ""]
    if result.get("status") != "ok" and "bytes_per_task" not in result:
        return [*out, f"Not measured: {result.get('status')}"]
    out += [
        "| measurement | bytes per task | keys per task | notes |",
        "|---|---:|---:|---|",
        f"| {result['tasks']:,} finished queue-scope tasks (default lock_queue_timeout) "
        f"| {result['bytes_per_task']:.1f} | {result['keys_per_task']:.2f} "
        f"| a kept key: `{result.get('sample_key')}` ({result.get('sample_type')}, PTTL "
        f"{result.get('sample_pttl_ms')} ms); published in {result['publish_s']:.0f} s, all "
        f"finished after {result['drain_s']:.0f} s |",
        f"| {result['keep_tasks']:,} tasks with lock_queue_timeout=2, right after "
        f"| {result['keep_bytes_per_task']:.1f} | | |",
        f"| the same, {result['keep_gone_s']:.1f} s later "
        f"| {result['keep_after_bytes_per_task']:.2f} | {result['keep_after_keys']} keys left "
        "in all | once no redelivery can happen |",
    ]
    floors_ = result.get("floors") or {}
    if floors_:
        out += ["", "| floor: shape of a per-task entry | bytes per entry |", "|---|---:|"]
        out += [f"| {name} | {value:.1f} |" for name, value in floors_.items()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="5,000 tasks")
    parser.add_argument("--tasks", type=int, help="queue-scope tasks (default 100,000)")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = parser.parse_args(argv)
    result = run_memory(
        args.quick, lambda text: print(text, file=sys.stderr, flush=True), args.tasks
    )
    print("\n".join(section(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

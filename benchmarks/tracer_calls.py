"""Calls into our own functions per task, in one process, with no worker and no pool:
Celery's tracer (``build_tracer``, what a pool process runs per message) calls a trivial
task ``--tasks`` times against a private redis-server, under ``cProfile``. A count of
calls does not depend on the machine's speed or load, so it compares two versions of the
package on a busy machine (``PYTHONPATH=<other checkout> python -m benchmarks.tracer_calls``),
where a drain rate cannot; ``make bench`` measures the rates.

Run ``python -m benchmarks.tracer_calls [--tasks 2000] [--kinds run,queue] [--top 15]``:
per kind, our calls per task (queue scope: the publish, ``apply_async`` to the private
server, included) and the functions called most.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import uuid
from typing import Any

from celery import Celery
from celery.app.trace import build_tracer

import celery_singleton_lock
from celery_singleton_lock import LockedTask
from celery_singleton_lock.testing import RedisServer

PACKAGE = celery_singleton_lock.__file__.rsplit("/", 1)[0]


def measure(url: str, kind: str, tasks: int) -> tuple[float, list[tuple[float, str]]]:
    """Our calls per task for a task of ``kind`` (run, queue), and the most called."""
    app = Celery(f"tracer-{kind}", broker=url.replace("/0", "/1"), set_as_current=False)
    app.conf.update(singleton_lock_url=url, task_ignore_result=True)

    @app.task(name=f"tracer.{kind}", base=LockedTask, lock_scope=kind, shared=False)
    def job(n: int) -> int:
        return n

    tracer = build_tracer(job.name, job, app=app, eager=False, propagate=True)

    def run(count: int, start: int) -> None:
        for n in range(start, start + count):
            task_id = job.apply_async((n,)).id if kind == "queue" else str(uuid.uuid4())
            request: dict[str, Any] = {
                "id": task_id,
                "task": job.name,
                "delivery_info": {"routing_key": "celery", "exchange": ""},
                "hostname": "tracer@localhost",
                "headers": {},
            }
            tracer(task_id, (n,), {}, request)

    run(50, 0)  # scripts loaded, connections open, caches filled
    profile = cProfile.Profile()
    profile.enable()
    run(tasks, 10**6)
    profile.disable()
    ours = [
        (calls / tasks, f"{path.removeprefix(PACKAGE + '/')}:{name}")
        for (path, _line, name), (_cc, calls, *_rest) in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
        if path.startswith(PACKAGE)
    ]
    return sum(calls for calls, _ in ours), sorted(ours, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--kinds", default="run,queue")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"package: {PACKAGE}")
    with RedisServer() as server:
        for kind in args.kinds.split(","):
            total, most = measure(server.url, kind, args.tasks)
            print(f"{kind} scope: {total:.1f} calls into our functions per task")
            for calls, name in most[: args.top]:
                print(f"  {calls:5.2f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Celery app of issue 24's benchmarks: ``benchmarks.celery_app`` plus a few tasks.

The worker runs ``celery -A benchmarks.celery_app_more`` (``bench_celery.APP_MODULE``);
everything of ``benchmarks.celery_app`` (its app, its tasks, its progress receivers) is
here too, and in addition:

- the 5 ms-body contenders (``plain-5ms``, ``csl-run-5ms``, ``csl-queue-5ms``): the same
  tasks whose body sleeps 5 ms, the drain target of "Celery, 5 ms bodies";
- ``csl-queue-keep2``: queue scope with ``lock_queue_timeout=2``, for the memory benchmark
  (``benchmarks.bench_memory``): what the lock server keeps once no redelivery can happen;
- a profiler: with ``CSL_BENCH_PROFILE`` set to a directory, each pool process runs its
  tasks under ``cProfile`` and writes ``prof-<pid>.pstats`` (and ``prof-<pid>.count``, the
  tasks it covers) every ``PROFILE_EVERY`` tasks (``benchmarks.profile_task``).
"""

from __future__ import annotations

import cProfile
import os
import time
from pathlib import Path
from typing import Any

from celery import signals

from benchmarks import celery_app
from benchmarks.celery_app import UNAVAILABLE, app, read_progress
from celery_singleton_lock import LockedTask

__all__ = ["PROFILE_EVERY", "TASKS", "UNAVAILABLE", "app", "read_progress"]

#: Task name of each contender (the benchmark's contender ids).
TASKS = {
    **celery_app.TASKS,
    "plain-5ms": "bench.plain_5ms",
    "csl-run-5ms": "bench.csl_run_5ms",
    "csl-queue-5ms": "bench.csl_queue_5ms",
    "csl-queue-keep2": "bench.csl_queue_keep2",
}
BODY_S = 0.005


@app.task(name=TASKS["plain-5ms"], ignore_result=True)
def plain_5ms(i: int) -> int:
    """The baseline with a 5 ms body."""
    time.sleep(BODY_S)
    return i + 1


@app.task(name=TASKS["csl-run-5ms"], base=LockedTask, lock_keys=None, ignore_result=True)
def csl_run_5ms(i: int) -> int:
    """Ours, run scope, 5 ms body."""
    time.sleep(BODY_S)
    return i + 1


@app.task(
    name=TASKS["csl-queue-5ms"],
    base=LockedTask,
    lock_keys=None,
    lock_scope="queue",
    ignore_result=True,
)
def csl_queue_5ms(i: int) -> int:
    """Ours, queue scope, 5 ms body."""
    time.sleep(BODY_S)
    return i + 1


@app.task(
    name=TASKS["csl-queue-keep2"],
    base=LockedTask,
    lock_keys=None,
    lock_scope="queue",
    lock_queue_timeout=2,
    ignore_result=True,
)
def csl_queue_keep2(i: int) -> int:
    """Ours, queue scope, with what it keeps for a late redelivery bounded to 2 s."""
    return i + 1


# -- the profiler (pool processes, only with CSL_BENCH_PROFILE) ------------------------------

PROFILE_EVERY = 250
_profile: cProfile.Profile | None = None
_profiled = 0


def _profile_dir() -> Path | None:
    value = os.environ.get("CSL_BENCH_PROFILE")
    return Path(value) if value else None


def _on_process_init(**_: Any) -> None:
    global _profile, _profiled  # noqa: PLW0603  # one profiler per pool process
    if _profile_dir() is None:
        return
    _profiled = 0
    _profile = cProfile.Profile()
    _profile.enable()


def _on_profiled_postrun(**_: Any) -> None:
    """Count the task; every PROFILE_EVERY tasks, write the profile so far (the profiler is
    paused while it writes)."""
    global _profiled  # noqa: PLW0603
    directory = _profile_dir()
    if _profile is None or directory is None:
        return
    _profiled += 1
    if _profiled % PROFILE_EVERY:
        return
    _profile.disable()
    pid = os.getpid()
    _profile.dump_stats(str(directory / f"prof-{pid}.pstats"))
    (directory / f"prof-{pid}.count").write_text(str(_profiled))
    _profile.enable()


signals.worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="csl-bench.prof")
signals.task_postrun.connect(_on_profiled_postrun, weak=False, dispatch_uid="csl-bench.profpost")

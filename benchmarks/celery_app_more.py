"""The Celery app of issue 24's benchmarks: ``benchmarks.celery_app`` plus a few tasks.

The worker runs ``celery -A benchmarks.celery_app_more`` (``bench_celery.APP_MODULE``);
everything of ``benchmarks.celery_app`` (its app, its tasks, its progress receivers) is
here too, and in addition:

- the 5 ms-body contenders (``plain-5ms``, ``csl-run-5ms``, ``csl-queue-5ms``, and since
  issue 32 ``floor-5ms``, ``celery-singleton-5ms``, ``celery-once-5ms``): the same tasks
  whose body sleeps 5 ms, the drain target of "Celery, 5 ms bodies";
- ``csl-queue-keep2``: queue scope with ``lock_queue_timeout=2``, for the memory benchmark
  (``benchmarks.bench_memory``): what the lock server keeps once no redelivery can happen;
- a profiler: with ``CSL_BENCH_PROFILE`` set to a directory, each pool process runs its
  tasks under ``cProfile``, starts afresh after its first ``PROFILE_SKIP`` tasks (they open
  connections and load scripts: a one-off, not the per-task cost), and writes
  ``prof-<pid>.pstats`` (and ``prof-<pid>.count``, the tasks it covers) every
  ``PROFILE_EVERY`` tasks (``benchmarks.profile_task``); with ``CSL_BENCH_PROFILE_MODE=sample``
  it runs the CPU-time sampler (``Sampler``) instead and writes ``sample-<pid>.json``.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from celery import signals

from benchmarks import celery_app
from benchmarks.celery_app import UNAVAILABLE, app, floor_locked, read_progress
from celery_singleton_lock import LockedTask

__all__ = ["PROFILE_EVERY", "TASKS", "UNAVAILABLE", "app", "read_progress"]

#: Task name of each contender (the benchmark's contender ids).
TASKS = {
    **celery_app.TASKS,
    "plain-5ms": "bench.plain_5ms",
    "csl-run-5ms": "bench.csl_run_5ms",
    "csl-queue-5ms": "bench.csl_queue_5ms",
    "floor-5ms": "bench.floor_5ms",
    "celery-singleton-5ms": "bench.singleton_5ms",
    "celery-once-5ms": "bench.once_5ms",
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


def _sleep_increment(i: int) -> int:
    time.sleep(BODY_S)
    return i + 1


@app.task(name=TASKS["floor-5ms"], ignore_result=True)
def floor_5ms(i: int) -> int | None:
    """The floor of a run-scope lock (``celery_app.floor_locked``), 5 ms body."""
    return floor_locked(TASKS["floor-5ms"], i, _sleep_increment)


if "celery-singleton" in UNAVAILABLE:
    UNAVAILABLE["celery-singleton-5ms"] = UNAVAILABLE["celery-singleton"]
else:
    from celery_singleton import Singleton  # type: ignore[import-untyped]

    @app.task(name=TASKS["celery-singleton-5ms"], base=Singleton, ignore_result=True)
    def singleton_5ms(i: int) -> int:
        """celery-singleton, 5 ms body."""
        return _sleep_increment(i)


if "celery-once" in UNAVAILABLE:
    UNAVAILABLE["celery-once-5ms"] = UNAVAILABLE["celery-once"]
else:
    from celery_once import QueueOnce  # type: ignore[import-untyped]

    @app.task(name=TASKS["celery-once-5ms"], base=QueueOnce, ignore_result=True)
    def once_5ms(i: int) -> int:
        """celery-once, 5 ms body."""
        return _sleep_increment(i)


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


# -- the profilers (pool processes, only with CSL_BENCH_PROFILE) -----------------------------

PROFILE_EVERY = 100
PROFILE_SKIP = 10
#: The sampler's period, in seconds of the pool process's CPU time (the kernel rounds it up
#: to its accounting tick: 4 ms at HZ=250; the figures use the CPU time actually covered).
SAMPLE_INTERVAL = 0.001


class Sampler:
    """CPU-time sampling of the running Python function: ``ITIMER_PROF`` sends ``SIGPROF``
    after each ``SAMPLE_INTERVAL`` of this process's CPU time, and each signal counts the
    code object Python is running when it handles it. Self-time attribution: a built-in
    counts in the Python function that called it. Unlike cProfile's own time it adds no cost
    per call and leaves out the time the process waits for a CPU (a loaded machine still
    makes the CPU time itself longer)."""

    def __init__(self) -> None:
        self.counts: Counter[Any] = Counter()
        self.cpu0 = 0.0

    def start(self) -> None:
        self.reset()
        signal.signal(signal.SIGPROF, self._on_signal)
        signal.setitimer(signal.ITIMER_PROF, SAMPLE_INTERVAL, SAMPLE_INTERVAL)

    def _on_signal(self, _signum: int, frame: FrameType | None) -> None:
        if frame is not None:
            self.counts[frame.f_code] += 1

    def reset(self) -> None:
        """Forget every sample so far."""
        self.counts.clear()
        self.cpu0 = _cpu_s()

    def dump(self, path: Path, tasks: int) -> None:
        """Write the samples, the tasks and the CPU seconds they cover as JSON."""
        cpu_s = _cpu_s() - self.cpu0
        counts = list(self.counts.items())
        samples = [[c.co_filename, c.co_firstlineno, c.co_name, n] for c, n in counts]
        path.write_text(json.dumps({"tasks": tasks, "cpu_s": cpu_s, "samples": samples}))


def _cpu_s() -> float:
    """User + system CPU seconds of this process (every thread)."""
    times = os.times()
    return times.user + times.system


_profile: cProfile.Profile | Sampler | None = None
_profiled = 0


def _profile_dir() -> Path | None:
    value = os.environ.get("CSL_BENCH_PROFILE")
    return Path(value) if value else None


def _on_process_init(**_: Any) -> None:
    """Start this pool process's profiler: cProfile, or with ``CSL_BENCH_PROFILE_MODE`` set
    to ``sample`` the CPU-time sampler."""
    global _profile, _profiled  # noqa: PLW0603  # one profiler per pool process
    if _profile_dir() is None:
        return
    _profiled = -PROFILE_SKIP
    if os.environ.get("CSL_BENCH_PROFILE_MODE") == "sample":
        _profile = Sampler()
        _profile.start()
    else:
        _profile = cProfile.Profile()
        _profile.enable()


def _on_profiled_postrun(**_: Any) -> None:
    """Count the task; after the first PROFILE_SKIP, start the profile afresh; every
    PROFILE_EVERY tasks after that, write the profile so far (cProfile is paused while it
    writes)."""
    global _profiled  # noqa: PLW0603
    directory = _profile_dir()
    if _profile is None or directory is None:
        return
    _profiled += 1
    if _profiled < 0 or (_profiled and _profiled % PROFILE_EVERY):
        return
    pid = os.getpid()
    if isinstance(_profile, Sampler):
        if _profiled == 0:
            _profile.reset()
        else:
            _profile.dump(directory / f"sample-{pid}.json", _profiled)
        return
    _profile.disable()
    if _profiled == 0:
        _profile.clear()
    else:
        _profile.dump_stats(str(directory / f"prof-{pid}.pstats"))
        (directory / f"prof-{pid}.count").write_text(str(_profiled))
    _profile.enable()


signals.worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="csl-bench.prof")
signals.task_postrun.connect(_on_profiled_postrun, weak=False, dispatch_uid="csl-bench.profpost")

"""The Celery app of the task benchmark (``benchmarks.bench_celery``).

The producer imports it and the benchmark worker runs ``celery -A benchmarks.celery_app``;
both read the servers from the environment (set by ``bench_celery``):

- ``CSL_BENCH_BROKER``: broker URL (its own redis-server);
- ``CSL_BENCH_LOCK``: the lock redis-server, for ours, celery-singleton and celery-once;
- ``CSL_BENCH_PROGRESS``: a fresh directory per run where the pool processes record
  their progress.

One trivial task per contender, each taking a distinct integer. The floor contender
(``floor``, issue 32) is a plain task whose body takes ``SET key token NX PX`` and releases
with an owner-checked Lua compare-and-delete (registered once, run with ``EVALSHA``), one
key per task name and argument: the least a run-scope lock costs in Celery, two round
trips and no integration at all. Progress is recorded by
``task_prerun``/``task_postrun`` receivers connected here, after the package's own
receivers, so a task counts as ended only after every contender's lock release. Each pool
process writes its first start, its count of ended tasks and its last end into a small
memory-mapped file: no system call and no Redis round trip per task, so the measurement
adds nothing to the per-task cost that the lock overhead is compared with. Timestamps are
``CLOCK_MONOTONIC`` (one clock for every process of the host). A competitor that fails to
import is left out and its error kept in ``UNAVAILABLE``.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery, signals

from benchmarks.contenders import COMPARE_AND_DELETE
from celery_singleton_lock import LockedTask

BROKER_URL = os.environ.get("CSL_BENCH_BROKER", "redis://127.0.0.1:6379/0")
LOCK_URL = os.environ.get("CSL_BENCH_LOCK", "redis://127.0.0.1:6380/0")

#: Task name of each contender (the benchmark's contender ids).
TASKS = {
    "plain": "bench.plain",
    "csl-run": "bench.csl_run",
    "csl-queue": "bench.csl_queue",
    "csl-run-3s": "bench.csl_run_3s",
    "floor": "bench.floor",
    "celery-singleton": "bench.singleton",
    "celery-once": "bench.once",
}
#: Contenders that could not be set up here, with the reason.
UNAVAILABLE: dict[str, str] = {}

app = Celery("csl_bench", broker=BROKER_URL, set_as_current=True)
app.conf.update(
    task_ignore_result=True,
    result_backend=None,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
    # ours
    singleton_lock_url=LOCK_URL,
    # celery-singleton (it would otherwise borrow the broker)
    singleton_backend_url=LOCK_URL,
    # celery-once
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": LOCK_URL, "default_timeout": 60},
    },
)


@app.task(name=TASKS["plain"], ignore_result=True)
def plain(i: int) -> int:
    """The baseline: a plain ``Task``."""
    return i + 1


@app.task(name=TASKS["csl-run"], base=LockedTask, lock_keys=None, ignore_result=True)
def csl_run(i: int) -> int:
    """Ours, run scope (lock held while the body runs), keyed on every argument."""
    return i + 1


@app.task(
    name=TASKS["csl-queue"], base=LockedTask, lock_keys=None, lock_scope="queue",
    ignore_result=True,
)  # fmt: skip
def csl_queue(i: int) -> int:
    """Ours, queue scope (lock taken at publish, held until the run ends)."""
    return i + 1


@app.task(
    name=TASKS["csl-run-3s"], base=LockedTask, lock_keys=None, lock_timeout=3,
    ignore_result=True,
)  # fmt: skip
def csl_run_3s(i: int) -> int:
    """Ours, run scope with a 3 s lease: the renewer's first look at a lock comes a third of
    a lease after it was taken, so within a short drain it reaches the steady state of a
    long-running worker (with the default 30 s lease that takes 10 s)."""
    return i + 1


#: The floor's lease: our default ``lock_timeout`` (30 s).
FLOOR_LEASE_MS = 30_000
#: The floor's client and release script: one per process (redis-py opens a fresh
#: connection pool in a forked pool process), the script's SHA computed once.
floor_client = redis.Redis.from_url(LOCK_URL)
floor_release = floor_client.register_script(COMPARE_AND_DELETE)


def floor_locked(name: str, i: int, body: Callable[[int], int]) -> int | None:
    """Run ``body(i)`` under the floor lock of (``name``, ``i``): ``SET NX PX`` with a fresh
    token, then the compare-and-delete. A key already taken skips the body (None); a
    release that finds another token raises, so the run counts as failed."""
    key = f"floor:{name}:{i}"
    token = uuid.uuid4().hex
    if not floor_client.set(key, token, nx=True, px=FLOOR_LEASE_MS):
        return None
    try:
        return body(i)
    finally:
        if not floor_release(keys=[key], args=[token]):
            raise RuntimeError(f"floor lock {key!r} was not held at release")


def _increment(i: int) -> int:
    return i + 1


@app.task(name=TASKS["floor"], ignore_result=True)
def floor(i: int) -> int | None:
    """The floor of a run-scope lock (issue 32): a plain task whose body locks itself."""
    return floor_locked(TASKS["floor"], i, _increment)


try:
    from celery_singleton import Singleton  # type: ignore[import-untyped]
except Exception as exc:  # any import failure makes it N/A, with the reason shown
    UNAVAILABLE["celery-singleton"] = f"import failed: {exc!r}"
else:

    @app.task(name=TASKS["celery-singleton"], base=Singleton, ignore_result=True)
    def singleton(i: int) -> int:
        """celery-singleton: locked at publish, unlocked in on_success/on_failure."""
        return i + 1


try:
    from celery_once import QueueOnce  # type: ignore[import-untyped]
except Exception as exc:
    UNAVAILABLE["celery-once"] = f"import failed: {exc!r}"
else:

    @app.task(name=TASKS["celery-once"], base=QueueOnce, ignore_result=True)
    def once(i: int) -> int:
        """celery-once: locked at publish, unlocked in after_return."""
        return i + 1


# -- progress recording (worker side) ----------------------------------------------------

_SLOT = struct.Struct("<QQQQ")  # first start ns, tasks ended, last end ns, odd ends
_TAIL = struct.Struct("<QQQ")  # the slot after its first field
_slot: tuple[int, mmap.mmap] | None = None
_ended = 0
_odd = 0


def now_ns() -> int:
    """System-wide monotonic clock, comparable across the processes of one host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def progress_dir() -> Path:
    """Where the pool processes of the current run keep their progress slots."""
    return Path(os.environ.get("CSL_BENCH_PROGRESS", "."))


def read_progress(directory: Path) -> tuple[list[int], int, int, int]:
    """(first start per process, tasks ended, last end, odd ends) of the slots in
    ``directory``; written by the pool processes, read by the producer."""
    starts: list[int] = []
    ended = last = odd = 0
    for path in directory.glob("slot-*"):
        data = path.read_bytes()
        if len(data) < _SLOT.size:
            continue
        first, count, end, bad = _SLOT.unpack_from(data)
        if first:
            starts.append(first)
        ended, last, odd = ended + count, max(last, end), odd + bad
    return starts, ended, last, odd


def _on_prerun(**_: Any) -> None:
    global _slot, _ended, _odd  # noqa: PLW0603  # one slot per pool process
    pid = os.getpid()
    if _slot is None or _slot[0] != pid:
        started = now_ns()
        path = progress_dir() / f"slot-{pid}"
        with path.open("w+b") as file:
            file.write(_SLOT.pack(started, 0, 0, 0))
            file.flush()
            _slot = (pid, mmap.mmap(file.fileno(), _SLOT.size))
        _ended = _odd = 0


def _on_postrun(retval: Any = None, state: Any = None, **_: Any) -> None:
    global _ended, _odd  # noqa: PLW0603  # this pool process's counters
    if _slot is None:
        return
    _ended += 1
    if state != "SUCCESS" or retval is None:  # failed, or a lock skipped the body
        _odd += 1
    _TAIL.pack_into(_slot[1], 8, _ended, now_ns(), _odd)


def _on_ready(**_: Any) -> None:
    """The worker's main process is consuming: note its CPU seconds so far (start-up)."""
    times = os.times()
    (progress_dir() / "ready").write_text(repr(times.user + times.system))


# Connected after celery_singleton_lock's receivers (imported above), so a run counts as
# ended only after our task_postrun release.
signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="csl-bench.prerun")
signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="csl-bench.postrun")
signals.worker_ready.connect(_on_ready, weak=False, dispatch_uid="csl-bench.ready")

"""The Celery app of the hot-key benchmark (``benchmarks.bench_hotkey``, issue 23).

The producer imports it and the benchmark worker runs ``celery -A benchmarks.hotkey_app``;
both read the servers from the environment (set by ``bench_hotkey``), which are databases of
one private redis-server:

- ``CSL_HOTKEY_BROKER``: broker URL;
- ``CSL_HOTKEY_BACKEND``: the worker's result backend (results are stored; park stores a
  parked call's ``PARKED`` state). The producer, which never reads a result, is given
  none: with a Redis backend every ``.delay()`` would subscribe to its result's channel;
- ``CSL_HOTKEY_LOCK``: the lock Redis (park queues live there too);
- ``CSL_HOTKEY_RECORDS``: where every body records its run and the worker its readiness;
- ``CSL_HOTKEY_SLEEP``: seconds each body sleeps (default 0.02).

One task per policy (``TASKS``), otherwise identical: run scope, keyed on the ``key``
argument only, the default lease. Every body sleeps, then RPUSHes
``"<kind> <n> <start> <end> <retries>"`` (``time.time()``, one clock for every process of
the host) to ``hotkey:runs:<run>``; ``retries`` is how often the call came back before it
ran: the task's own ``request.retries`` (the retry policy's retries count there) plus the
lock layer's uncounted ones (the ``singleton_lock_retries`` header). The record is written
after ``end`` is stamped and before the body returns, so the key is still held while it is
written: a hand-off gap includes it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, signals

from celery_singleton_lock import LockedTask
from celery_singleton_lock.runtime.headers import HEADER_LOCK_RETRIES, header

BROKER_URL = os.environ.get("CSL_HOTKEY_BROKER", "redis://127.0.0.1:6379/0")
BACKEND_URL = os.environ.get("CSL_HOTKEY_BACKEND") or None
LOCK_URL = os.environ.get("CSL_HOTKEY_LOCK", "redis://127.0.0.1:6379/2")
RECORDS_URL = os.environ.get("CSL_HOTKEY_RECORDS", "redis://127.0.0.1:6379/3")
SLEEP = float(os.environ.get("CSL_HOTKEY_SLEEP", "0.02"))
#: ``lock_wait`` of the wait policy: far longer than any measurement, so no call gives up.
WAIT_SECONDS = 600.0
#: Key the worker sets (to its pid) once it consumes (``worker_ready``).
READY_KEY = "hotkey:ready"

#: Task name of each policy.
TASKS = {
    "park": "hotkey.park",
    "wait": "hotkey.wait",
    "retry": "hotkey.retry",
}

app = Celery("csl_hotkey", broker=BROKER_URL, backend=BACKEND_URL, set_as_current=True)
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
    result_expires=3600,
    singleton_lock_url=LOCK_URL,
)

_records: redis.Redis | None = None
_records_pid = 0


def records() -> redis.Redis:
    """A client of the records database for this process (made again after a fork)."""
    global _records, _records_pid  # noqa: PLW0603 - one lazily built client per process
    if _records is None or _records_pid != os.getpid():
        _records = redis.Redis.from_url(RECORDS_URL)
        _records_pid = os.getpid()
    return _records


def runs_key(run: str) -> str:
    """The list the bodies of measurement ``run`` record to."""
    return f"hotkey:runs:{run}"


def retries_of(request: Any) -> int:
    """How often this call came back before this run: the task's own retries plus the lock
    layer's (carried in the ``singleton_lock_retries`` header, not in ``request.retries``)."""
    return int(request.retries or 0) + int(header(request, HEADER_LOCK_RETRIES) or 0)


def body(task: Any, kind: str, n: int, run: str) -> int:
    """The work: sleep ``SLEEP`` seconds, then record the run (see the module docstring)."""
    start = time.time()
    time.sleep(SLEEP)
    end = time.time()
    line = f"{kind} {n} {start:.6f} {end:.6f} {retries_of(task.request)}"
    records().rpush(runs_key(run), line)
    return n


@app.task(
    name=TASKS["park"], bind=True, base=LockedTask, lock_keys=["key"], lock_on_conflict="park",
)  # fmt: skip
def park_job(self: Any, key: str, kind: str, n: int, run: str) -> int:
    """Park: a run whose key is held parks in the lock Redis; the release hands it on."""
    return body(self, kind, n, run)


@app.task(
    name=TASKS["wait"], bind=True, base=LockedTask, lock_keys=["key"], lock_on_conflict="wait",
    lock_wait=WAIT_SECONDS,
)  # fmt: skip
def wait_job(self: Any, key: str, kind: str, n: int, run: str) -> int:
    """Wait: a run whose key is held blocks its pool process until the key is handed to it."""
    return body(self, kind, n, run)


@app.task(
    name=TASKS["retry"], bind=True, base=LockedTask, lock_keys=["key"],
    lock_on_conflict="retry", max_retries=None,
)  # fmt: skip
def retry_job(self: Any, key: str, kind: str, n: int, run: str) -> int:
    """Retry with the default backoff (1 s doubling, bounded by the holder's lease). These
    retries count against ``max_retries``: with Celery's default of 3 a hot key's calls
    would fail, so it is unlimited here, as the docs advise."""
    return body(self, kind, n, run)


def _on_ready(**_: Any) -> None:
    """The worker consumes: say so in the records database (the worker logs at WARNING,
    which has no `` ready.`` line)."""
    records().set(READY_KEY, os.getpid())


signals.worker_ready.connect(_on_ready, weak=False, dispatch_uid="csl-hotkey.ready")


# --- profiling (off by default) -------------------------------------------------------------
#: A directory: when set, every process of the worker (main and pool) runs under cProfile
#: and writes ``<role>-<pid>.prof`` there as it exits. For finding where CPU goes, never
#: for a measurement (cProfile slows every call down).
PROFILE_DIR = os.environ.get("CSL_HOTKEY_PROFILE") or None

if PROFILE_DIR:
    import cProfile

    _profiler: cProfile.Profile | None = None

    def _profile_start(**_: Any) -> None:
        global _profiler  # noqa: PLW0603 - one profiler per process
        # CPU time, not wall time: a process waiting on a socket costs nothing.
        _profiler = cProfile.Profile(time.process_time)
        _profiler.enable()

    def _profile_dump(role: str) -> None:
        if _profiler is not None:
            _profiler.disable()
            _profiler.dump_stats(os.path.join(PROFILE_DIR or ".", f"{role}-{os.getpid()}.prof"))

    signals.worker_process_init.connect(_profile_start, weak=False)
    signals.worker_process_shutdown.connect(
        lambda **_: _profile_dump("pool"), weak=False, dispatch_uid="csl-hotkey.prof-pool"
    )
    signals.worker_init.connect(_profile_start, weak=False)
    signals.worker_shutdown.connect(
        lambda **_: _profile_dump("main"), weak=False, dispatch_uid="csl-hotkey.prof-main"
    )

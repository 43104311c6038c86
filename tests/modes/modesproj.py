"""The Celery app the modes tests run in real ``celery worker`` processes.

``CSL_MODES_URL`` is broker, result backend, lock Redis and data Redis at once (a private
server); ``CSL_MODES_METRICS_PORT``, when set, serves the lock metrics from the worker.
Every task writes a ledger entry in the data Redis as its body starts and ends (time,
worker, pid), and every signal of the package is recorded in a list per lock key, so the
tests can check what ran, when, where, and what each process reported.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, current_lock, metrics, signals
from celery_singleton_lock.modes.throttle import starts_key

URL = os.environ.get("CSL_MODES_URL", "redis://127.0.0.1:6399/0")

app = Celery("modesproj", broker=URL, backend=URL)
app.conf.update(
    singleton_lock_url=URL,
    singleton_lock_prefix="modes",
    task_default_queue="csl-modes",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

if os.environ.get("CSL_MODES_METRICS_PORT"):
    metrics.install(app, port=int(os.environ["CSL_MODES_METRICS_PORT"]), addr="127.0.0.1")

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(URL)
        _data_pid = os.getpid()
    return _data


def _record(signal: Any = None, sender: Any = None, **kwargs: Any) -> None:
    """Append one signal, with its sender's name and this process's pid, to its key's list."""
    entry = {"signal": signal.name, "sender": getattr(sender, "name", None), "pid": os.getpid()}
    data().rpush(f"signals:{kwargs['key']}", json.dumps({**entry, **kwargs}, default=str))


for _signal in (
    signals.lock_acquired,
    signals.lock_released,
    signals.lock_conflict,
    signals.lock_lost,
    signals.lock_throttled,
):
    _signal.connect(_record, weak=False, dispatch_uid=f"modes.record.{_signal.name}")


def gate_key(name: str) -> str:
    """The key a test sets to end the bodies of ``name`` that wait for it."""
    return f"gate:{name}"


def body(task: Any, name: str, seconds: float) -> None:
    """The ledger of a run of ``name``: its start (wall time, worker, pid, whether a lock is
    held), ``inside`` / ``overlaps`` counters, and its end after ``seconds`` (a negative
    number: once the test sets :func:`gate_key`, 60 s at most)."""
    r = data()
    lock = current_lock()
    started = {
        "at": time.time(), "worker": task.request.hostname, "pid": os.getpid(),
        "task_id": task.request.id, "holds_lock": bool(lock and lock.owned()),
    }  # fmt: skip
    if r.incr(f"inside:{name}") > 1:
        r.incr(f"overlaps:{name}")
    r.rpush(f"starts:{name}", json.dumps(started))
    if seconds >= 0:
        time.sleep(seconds)
    else:
        deadline = time.monotonic() + 60
        while not r.exists(gate_key(name)) and time.monotonic() < deadline:
            time.sleep(0.02)
    r.rpush(f"ends:{name}", json.dumps({"at": time.time(), "task_id": task.request.id}))
    r.decr(f"inside:{name}")


# -- the throttle ----------------------------------------------------------------------


def admitted(task: Any, name: str, *args: Any) -> None:
    """Copy this run's admission from the throttle's starts set (a member
    ``<task id>:<s>.<us>`` scored in server ms) to the hash ``admitted-at:<name>``: the tests
    judge the rate on the server's clock, not on when the bodies wrote their ledger."""
    r = data()
    mine = f"{task.request.id}:".encode()
    key = starts_key(task.lock_key(name, *args))
    for member, score in r.zrange(key, 0, -1, withscores=True):
        if member.startswith(mine):
            r.hset(f"admitted-at:{name}", member, int(score))


@app.task(
    name="modes.rate_retry", base=LockedTask, bind=True, lock_keys=["name"],
    lock_rate_limit="3/s", lock_on_conflict="retry", lock_retry_delay=0.1, max_retries=None,
)  # fmt: skip
def rate_retry(self: Any, name: str, n: int) -> int:
    """At most 3 starts per second per name, across every worker; over it, retry."""
    admitted(self, name, n)
    body(self, name, 0.02)
    return n


@app.task(
    name="modes.rate_skip", base=LockedTask, bind=True, lock_keys=["name"],
    lock_rate_limit="1/m",
)  # fmt: skip
def rate_skip(self: Any, name: str) -> str:
    """One start per minute per name; over it, skip (the default policy)."""
    body(self, name, 0.02)
    return "ran"


@app.task(
    name="modes.rate_wait", base=LockedTask, bind=True, lock_keys=["name"],
    lock_rate_limit="1/s", lock_on_conflict="wait", lock_wait=5,
)  # fmt: skip
def rate_wait(self: Any, name: str) -> str:
    """One start per second per name; over it, wait for the next free start (5 s at most)."""
    admitted(self, name)
    body(self, name, 0.02)
    return "ran"


@app.task(
    name="modes.rate_raise", base=LockedTask, bind=True, lock_keys=["name"],
    lock_rate_limit="1/m", lock_on_conflict="raise",
)  # fmt: skip
def rate_raise(self: Any, name: str) -> str:
    """One start per minute per name; over it, fail with TaskThrottled."""
    body(self, name, 0.02)
    return "ran"


@app.task(
    name="modes.rate_queue", base=LockedTask, bind=True, lock_keys=["name"],
    lock_scope="queue", lock_rate_limit="1/s", lock_on_conflict="retry", max_retries=None,
)  # fmt: skip
def rate_queue(self: Any, name: str) -> str:
    """Queue scope throttles starts too: over the rate, the message retries holding its key."""
    admitted(self, name)
    body(self, name, 0.02)
    return str(self.request.id)


# -- the lifetimes ---------------------------------------------------------------------


@app.task(
    name="modes.start_release", base=LockedTask, bind=True, lock_keys=["name"],
    lock_scope="queue", lock_release="start",
)  # fmt: skip
def start_release(self: Any, name: str, seconds: float) -> str:
    """Queue scope whose key frees as the body starts (celery-once's unlock_before_run)."""
    body(self, name, seconds)
    return str(self.request.id)


@app.task(
    name="modes.start_retry", base=LockedTask, bind=True, lock_keys=["name"],
    lock_scope="queue", lock_release="start", max_retries=3,
)  # fmt: skip
def start_retry(self: Any, name: str, seconds: float, retry: bool) -> str:
    """Like start_release; with ``retry`` its first attempt calls self.retry() once the test
    has published another message for the same key."""
    body(self, name, seconds)
    if retry and self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return str(self.request.id)


@app.task(
    name="modes.success_queue", base=LockedTask, bind=True, lock_keys=["name"],
    lock_scope="queue", lock_release="success", lock_hold=6.0, lock_timeout=0.6,
)  # fmt: skip
def success_queue(self: Any, name: str, fail: bool = False) -> str:
    """Queue scope: a success keeps the key 6 s (longer than a loaded machine takes between
    a result and the next call); a failure frees it at once. The 0.6 s lease is renewed
    every 0.2 s while the body runs (and must not be after it)."""
    body(self, name, 0.05)
    if fail:
        raise RuntimeError("the run failed")
    return str(self.request.id)


@app.task(
    name="modes.success_run", base=LockedTask, bind=True, lock_keys=["name"],
    lock_release="success", lock_hold=1.5, max_retries=3,
)  # fmt: skip
def success_run(self: Any, name: str, retry: bool = False) -> str:
    """Run scope: a success keeps the key 1.5 s (later runs meet the skip policy); with
    ``retry`` the first attempt retries, which is not a success."""
    body(self, name, 0.05)
    if retry and self.request.retries == 0:
        raise self.retry(countdown=1.5)
    return f"attempt {self.request.retries + 1}"


@app.task(
    name="modes.success_killed", base=LockedTask, bind=True, lock_keys=["name"],
    lock_scope="queue", lock_release="success", lock_hold=60.0,
)  # fmt: skip
def success_killed(self: Any, name: str) -> str:
    """Queue scope with a 60 s success hold, whose pool process the test kills: not a
    success."""
    body(self, name, 30.0)
    return "never"

"""The Celery project of tests/worker/test_explain.py: one task per state a key can be in
(held by a run, waited for, parked on, throttled, held after a success, slots), each body
recording its pool process's pid in the data Redis before it sleeps, so the test can
compare what ``lock_explain`` says with who really holds the key."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("explain_proj", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL"))
app.conf.update(
    task_default_queue="csl-explain",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(BROKER)
        _data_pid = os.getpid()
    return _data


def busy(name: str, seconds: float) -> str:
    """Record this run's pid under ``name``, then sleep ``seconds`` or until the test pushes
    to ``go:<name>`` (so a test on a loaded machine can hold as long as it needs, then end
    the run at once)."""
    data().rpush(f"pids:{name}", os.getpid())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not data().exists(f"go:{name}"):
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return name


@app.task(name="explain.hold", base=LockedTask, lock_keys=["name"], lock_on_conflict="wait",
          lock_timeout=9.0, lock_wait=60.0)  # fmt: skip
def hold(name: str, seconds: float = 0.0) -> str:
    """Run scope, wait: later runs of the key queue up behind the holder."""
    return busy(name, seconds)


@app.task(name="explain.skip", base=LockedTask, lock_keys=["name"], lock_timeout=9.0)
def skip(name: str, seconds: float = 0.0) -> str:
    """Run scope, skip (the default)."""
    return busy(name, seconds)


@app.task(name="explain.fail", base=LockedTask, lock_keys=["name"], lock_on_conflict="raise",
          lock_timeout=9.0)  # fmt: skip
def fail(name: str, seconds: float = 0.0) -> str:
    """Run scope, raise: a run whose key is held fails with TaskLocked."""
    return busy(name, seconds)


@app.task(name="explain.park", base=LockedTask, lock_keys=["name"], lock_on_conflict="park",
          lock_timeout=9.0)  # fmt: skip
def park(name: str, seconds: float = 0.0) -> str:
    """Run scope, park: a run whose key is held parks."""
    return busy(name, seconds)


@app.task(name="explain.paced", base=LockedTask, lock_keys=["name"], lock_rate_limit="2/m")
def paced(name: str) -> str:
    """At most two starts a minute per name; a throttled run is skipped."""
    return busy(name, 0.0)


@app.task(name="explain.once", base=LockedTask, lock_keys=["name"], lock_release="success",
          lock_hold=30.0)  # fmt: skip
def once(name: str) -> str:
    """A success keeps the key 30 s more."""
    return busy(name, 0.0)


@app.task(name="explain.slots", base=LockedTask, lock_keys=["name"], lock_limit=3,
          lock_timeout=9.0)  # fmt: skip
def slots(name: str, seconds: float = 0.0) -> str:
    """Up to three runs of a name at once."""
    return busy(name, seconds)

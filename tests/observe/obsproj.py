"""The Celery app the observability tests run in a real ``celery worker``.

Configured from the environment: ``CSL_OBS_URL`` is broker, result backend, lock Redis and
data Redis at once (a private server); ``CSL_OBS_METRICS_PORT``, when set, serves the lock
metrics from the worker. Every signal of the package is recorded in the data Redis, in a
list per lock key, so tests can read what each process sent; one receiver always raises,
to show that a broken receiver never breaks a task.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, metrics, signals

URL = os.environ.get("CSL_OBS_URL", "redis://127.0.0.1:6399/0")

app = Celery("obsproj", broker=URL, backend=URL)
app.conf.update(
    singleton_lock_url=URL,
    singleton_lock_prefix="obs",
    task_default_queue="csl-observe",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

if os.environ.get("CSL_OBS_METRICS_PORT"):
    metrics.install(app, port=int(os.environ["CSL_OBS_METRICS_PORT"]), addr="127.0.0.1")

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(URL)
        _data_pid = os.getpid()
    return _data


def gate_key(gate: str) -> str:
    """The key a test sets to let a body that waits on ``gate`` end."""
    return f"gate:{gate}"


def _sleep(gate: str, seconds: float) -> None:
    """Sleep ``seconds``; a negative number: until the test opens ``gate`` (:func:`gate_key`;
    60 s at most), so a test orders events by its own moves, not by how long a body runs."""
    if seconds >= 0:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + 60
    while not data().exists(gate_key(gate)) and time.monotonic() < deadline:
        time.sleep(0.02)


def signals_key(lock_key: str) -> str:
    """The list where the signals about ``lock_key`` are recorded."""
    return f"signals:{lock_key}"


def _record(signal: Any = None, sender: Any = None, **kwargs: Any) -> None:
    """Append one signal, with its sender's name and this process's pid, to its key's list."""
    entry = {"signal": signal.name, "sender": getattr(sender, "name", None), "pid": os.getpid()}
    data().rpush(signals_key(kwargs["key"]), json.dumps({**entry, **kwargs}, default=str))


def _broken(**_: Any) -> None:
    """A receiver with a bug: Celery logs it, the task goes on."""
    raise RuntimeError("a broken lock_acquired receiver")


for _signal in (
    signals.lock_acquired,
    signals.lock_released,
    signals.lock_conflict,
    signals.lock_lost,
    signals.lock_renewed,
):
    _signal.connect(_record, weak=False, dispatch_uid=f"obs.record.{_signal.name}")
signals.lock_acquired.connect(_broken, weak=False, dispatch_uid="obs.broken")


@app.task(name="obs.job", base=LockedTask, lock_keys=["name"])
def job(name: str, seconds: float) -> str:
    """Default policy (skip): sleep (< 0: until gate ``job:<name>`` opens), say it ran."""
    _sleep(f"job:{name}", seconds)
    return "ran"


@app.task(name="obs.waiter", base=LockedTask, lock_keys=["name"], lock_on_conflict="wait")
def waiter(name: str, seconds: float) -> str:
    """Policy wait: a duplicate waits for the holder (< 0: until gate ``waiter:<name>``)."""
    _sleep(f"waiter:{name}", seconds)
    return "ran"


@app.task(name="obs.raiser", base=LockedTask, lock_keys=["name"], lock_on_conflict="raise")
def raiser(name: str, seconds: float) -> str:
    """Policy raise: a duplicate fails with TaskLocked."""
    time.sleep(seconds)
    return "ran"


@app.task(name="obs.overrun", base=LockedTask, lock_keys=["name"], lock_timeout=0.6,
          lock_renew=False)  # fmt: skip
def overrun(name: str, seconds: float) -> str:
    """A body that outlives its unrenewed 0.6 s lease: the lease is lost while it runs."""
    time.sleep(seconds)
    return "ran"


@app.task(name="obs.renewed", base=LockedTask, lock_keys=["name"], lock_timeout=0.6)
def renewed(name: str, seconds: float) -> str:
    """A body that outlives its 0.6 s lease, renewed every 0.2 s meanwhile."""
    time.sleep(seconds)
    return "ran"


@app.task(name="obs.queued", base=LockedTask, lock_keys=["name"], lock_scope="queue")
def queued(name: str, seconds: float) -> str:
    """Queue scope: a duplicate .delay() while one is queued or running publishes nothing."""
    time.sleep(seconds)
    return "ran"


@app.task(name="obs.export", base=LockedTask, lock_keys=["name"],
          lock_limits=[("tenant:{tenant}", 4), ("global:exports", 10)], lock_weight=2)  # fmt: skip
def export(name: str, tenant: str, seconds: float) -> str:
    """Stacked limits: its limits' use shows as gauges."""
    time.sleep(seconds)
    return name

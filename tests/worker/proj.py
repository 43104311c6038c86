"""The Celery app the worker tests run in real ``celery worker`` processes.

Configured from the environment so the test process and its workers agree:
``CSL_BROKER_URL`` (broker), ``CSL_LOCK_URL`` (lock Redis, default: the broker),
``CSL_DATA_URL`` (where tasks keep their shared state), ``CSL_FAIL_OPEN``.
Every task records what it did in Redis so tests can check overlap and counts.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import threading
import time
from typing import Any

import redis
from celery import Celery, Task, signals

from celery_singleton_lock import LockedTask, RedisLock, current_lock

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6399/0")

app = Celery("proj", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL") or None)
app.conf.update(
    singleton_lock_url=os.environ.get("CSL_LOCK_URL") or None,
    singleton_lock_fail_open=os.environ.get("CSL_FAIL_OPEN") == "1",
    singleton_lock_on_conflict=os.environ.get("CSL_ON_CONFLICT") or "skip",
    singleton_lock_tasks={
        "tests.worker.proj.plain_*": {"lock_keys": ["x"]},
        "tests.worker.proj.traced_config": {},
    },
    task_default_queue=os.environ.get("CSL_QUEUE", "csl-tests"),
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("CSL_VISIBILITY") or 3600)
    },
    broker_connection_retry_on_startup=True,
    task_acks_late=False,
    accept_content=(os.environ.get("CSL_ACCEPT") or "json").split(","),
    result_expires=600,
    # Tests stop their Redis at the end: do not retry the result backend for minutes then.
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
    beat_schedule={
        "dedup": {"task": "tests.worker.proj.beat_job", "schedule": 1.0, "args": ("beat",)}
    },
)

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(os.environ.get("CSL_DATA_URL", BROKER))
        _data_pid = os.getpid()
    return _data


def section(name: str, seconds: float) -> None:
    """A critical section that records overlap: max concurrent holders of ``name``."""
    r = data()
    inside = r.incr(f"inside:{name}")
    r.rpush(f"events:{name}", f"start {time.time():.6f} {os.getpid()}")
    if inside > 1:
        r.incr(f"overlaps:{name}")
    time.sleep(seconds)
    r.rpush(f"events:{name}", f"end {time.time():.6f}")
    r.decr(f"inside:{name}")


@app.task(base=LockedTask, lock_keys=["sku"], lock_on_conflict="wait", lock_timeout=10)
def buy(sku: str, user_id: int) -> bool:
    """Flash sale: a deliberately non-atomic read-check-write of the stock."""
    r = data()
    if r.incr(f"inside:{sku}") > 1:
        r.incr(f"overlaps:{sku}")
    stock = int(r.get(f"stock:{sku}") or 0)
    time.sleep(0.005)
    sold = stock > 0
    if sold:
        r.set(f"stock:{sku}", stock - 1)
        r.rpush(f"sold:{sku}", user_id)
    r.decr(f"inside:{sku}")
    return sold


@app.task(base=LockedTask, lock_keys=["tenant"], lock_on_conflict="wait")
def next_id(tenant: str) -> int:
    """Global sequence: read, increment, write back; must never hand out a number twice."""
    r = data()
    number = int(r.get(f"seq:{tenant}") or 0) + 1
    time.sleep(0.002)
    r.set(f"seq:{tenant}", number)
    r.rpush(f"ids:{tenant}", number)
    fence = current_lock()
    r.rpush(f"fences:{tenant}", fence.fencing_token if fence and fence.fencing_token else -1)
    return number


@app.task(base=LockedTask)
def skippy(name: str, seconds: float = 1.0) -> str:
    """Default policy (skip): a duplicate while this runs does nothing."""
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_keys=["a", "b"])
def bound(a: int, b: int = 2, note: str = "") -> str:
    """Keys only on a and b, after binding: f(1), f(1, 2), f(a=1, b=2) are one lock."""
    section(f"bound-{a}-{b}", 1.0)
    return note


@app.task(base=LockedTask, lock_scope="queue")
def queued(name: str, seconds: float = 1.0) -> str:
    """Queue scope: held from delay() until the run ends."""
    section(name, seconds)
    return "ran"


@signals.task_success.connect
def _held_at_success(sender: Any = None, **_: Any) -> None:
    """For skippy and queued: whether this run still holds its key when Celery has stored
    the result (what a caller of ``get()`` sees), kept in ``held-at-success:<name>`` (the
    next call may hold it by now: only this run's own hold counts)."""
    if sender is None or sender.name not in {skippy.name, queued.name}:
        return
    args, kwargs = sender.request.args or (), sender.request.kwargs or {}
    lock_redis = redis.Redis.from_url(os.environ.get("CSL_LOCK_URL") or BROKER)
    holder = RedisLock(lock_redis, sender.lock_key(*args, **kwargs)).holder()
    held = holder is not None and holder.task_id == sender.request.id
    data().rpush(f"held-at-success:{args[0]}", int(held))
    lock_redis.close()


@app.task(base=LockedTask, lock_scope="queue", lock_queue_timeout=1.0)
def queued_short(name: str) -> str:
    """Queue scope with a 1 s queued lease: a message stuck longer stops deduplicating."""
    section(name, 0.1)
    return "ran"


@app.task(base=LockedTask, lock_on_conflict="raise")
def raising(name: str, seconds: float = 1.0) -> str:
    """Raise policy: a duplicate fails with TaskLocked."""
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_on_conflict="retry", lock_retry_delay=0.3, max_retries=50)
def retrying(name: str, seconds: float = 1.0) -> str:
    """Retry policy: a duplicate comes back later and runs after the first."""
    section(name, seconds)
    return "ran"


def _retry_once(task: Any, name: str) -> str:
    r = data()
    attempt = r.incr(f"attempts:{name}")
    r.rpush(f"locked-during:{name}", int(bool(current_lock() and current_lock().owned())))  # type: ignore[union-attr]
    if attempt == 1:
        raise task.retry(countdown=1.5)
    return f"attempt {attempt}"


@app.task(base=LockedTask, bind=True, lock_scope="queue", max_retries=3)
def retry_queue(self: Any, name: str) -> str:
    """Queue scope + self.retry(): the lock follows the retried message."""
    return _retry_once(self, name)


@app.task(base=LockedTask, bind=True, max_retries=3)
def retry_run(self: Any, name: str) -> str:
    """Run scope + self.retry(): the lock is released between attempts."""
    return _retry_once(self, name)


@app.task(base=LockedTask, lock_timeout=1.0)
def renewing(name: str, seconds: float = 4.0) -> str:
    """A body four times longer than its 1 s lease: renewal keeps others out."""
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_keys=["name"], lock_timeout=2.0, lock_on_conflict="wait",
          lock_wait=30)  # fmt: skip
def crashy(name: str, seconds: float = 60.0) -> str:
    """Runs long enough to be killed mid-run (one lock per name, whatever ``seconds``)."""
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_timeout=30.0, time_limit=1.5)
def hard_limit(name: str) -> str:
    """Exceeds its hard time limit: the pool kills the child; the parent frees the lock."""
    data().rpush(f"events:{name}", "start")
    time.sleep(30)
    return "never"


@app.task(base=LockedTask, bind=True, acks_late=True, reject_on_worker_lost=True, lock_timeout=30.0)
def redelivered(self: Any, name: str) -> str:
    """acks_late + reject_on_worker_lost: a killed child's message comes back; the first
    delivery hangs (to be killed), the redelivery must run, not skip on its own dead lock."""
    r = data()
    r.rpush(f"events:{name}", f"start {time.time():.6f} {os.getpid()}")
    if r.incr(f"deliveries:{name}") == 1:
        time.sleep(60)
    return "ran"


@app.task
def plain_job(x: str, seconds: float = 1.0) -> str:
    """A task that does not use LockedTask; locked only through singleton_lock_tasks."""
    section(f"plain-{x}", seconds)
    return "ran"


@app.task(base=LockedTask, lock_scope="queue")
def beat_job(name: str) -> str:
    """A periodic job that takes three times its one-second period."""
    section(name, 3.0)
    return "ran"


_call_context = threading.local()


class Traced(Task):  # type: ignore[type-arg]
    """A base class with its own ``__call__`` (Flask's app-context pattern): the body must
    run inside it, locked or not."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _call_context.inside = True
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _call_context.inside = False


class TracedLocked(LockedTask, Traced):
    """LockedTask first, the custom ``__call__`` after it in the MRO."""


def _record_call(task: Any, name: str) -> str:
    lock = current_lock()
    data().rpush(
        f"traced:{name}",
        json.dumps({
            "inside": getattr(_call_context, "inside", False),
            "locked": bool(lock and lock.owned()),
            "task_id": task.request.id,
        }),
    )  # fmt: skip
    section(f"traced-{name}", 0.3)
    return str(task.request.id)


@app.task(base=TracedLocked, bind=True)
def traced_locked(self: Any, name: str) -> str:
    """A LockedTask whose class hierarchy has a custom ``__call__``."""
    return _record_call(self, name)


@app.task(base=Traced, bind=True)
def traced_config(self: Any, name: str) -> str:
    """A task with a custom ``__call__`` locked through ``singleton_lock_tasks``."""
    return _record_call(self, name)


class Color(enum.IntEnum):
    """An IntEnum argument: JSON and msgpack send it as its int."""

    RED = 1


class Size(str, enum.Enum):
    """A str-based Enum argument: JSON and msgpack send it as its string."""

    SMALL = "small"


@app.task(base=LockedTask, lock_scope="queue")
def odd_queued(value: Any, tag: str) -> str:
    """Queue scope over an argument whose serializer round trip changes it."""
    lock = current_lock()
    data().rpush(f"odd-keys:{tag}", lock.name if lock else "")
    section(f"odd-{tag}", 1.5)
    return "ran"


@app.task(base=LockedTask)
def odd_run(value: Any, tag: str) -> str:
    """Run scope over the same arguments: records the key the worker locked."""
    lock = current_lock()
    data().rpush(f"odd-keys:{tag}", lock.name if lock else "")
    return "ran"


@app.task(
    base=LockedTask, lock_scope="queue", lock_on_conflict="retry", lock_retry_delay=0.3,
    lock_queue_timeout=1.0, max_retries=50,
)  # fmt: skip
def queued_retry(name: str) -> str:
    """Queue scope + retry policy whose queued lease (1 s) can lapse before it runs."""
    section(name, 0.1)
    return "ran"


@app.task(
    base=LockedTask, lock_keys=["name"], lock_on_conflict="retry", lock_timeout=30.0,
    max_retries=50,
)  # fmt: skip
def retry_auto(name: str, seconds: float) -> str:
    """Retry policy with the automatic countdown (no lock_retry_delay)."""
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_keys=["name"], lock_timeout=30.0)
def stubborn(name: str, seconds: float) -> str:
    """Keeps running after SIGTERM (revoke(terminate=True)), as a body that handles the
    signal or sits in a C call would."""
    signal.signal(signal.SIGTERM, lambda *_: data().rpush(f"sigterm:{name}", os.getpid()))
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, lock_scope="queue", lock_keys=["name"], acks_late=True)
def late_queued(name: str, seconds: float) -> str:
    """Queue scope + acks_late: a broker redelivery while it runs must not run beside it."""
    data().incr(f"runs:{name}")
    section(name, seconds)
    return "ran"


@app.task(base=LockedTask, bind=True, lock_keys=["name"], max_retries=3)
def retry_hold(self: Any, name: str, hold: float) -> str:
    """Run scope + skip: with ``hold`` it holds the lock that long; without, its first
    attempt calls self.retry() and its second must still run."""
    if hold:
        section(name, hold)
        return "held"
    attempt = data().incr(f"attempts:{name}")
    if attempt == 1:
        raise self.retry(countdown=1.0)
    section(name, 0.1)
    return f"attempt {attempt}"


def _slot_section(name: str, seconds: float, slots: int) -> str:
    """A body that records how many runs of ``name`` are inside at once (more than
    ``slots`` is an overrun), per task id too (a delivery beside itself is a duplicate),
    and its fencing token."""
    r = data()
    lock = current_lock()
    task_id = limited.request.id if lock is not None else "?"
    inside = r.incr(f"inside:{name}")
    r.rpush(f"peaks:{name}", inside)
    r.rpush(f"pids:{name}", os.getpid())
    if inside > slots:
        r.incr(f"over:{name}")
    if r.incr(f"inside:{name}:{task_id}") > 1:
        r.incr(f"twice:{name}")
    r.rpush(f"fences:{name}", lock.fencing_token if lock is not None else -1)
    time.sleep(seconds)
    r.decr(f"inside:{name}:{task_id}")
    r.decr(f"inside:{name}")
    r.incr(f"done:{name}")
    return "ran"


@app.task(base=LockedTask, lock_keys=["name"], lock_limit=3, lock_on_conflict="wait",
          lock_wait=300, lock_timeout=5)  # fmt: skip
def limited(name: str, seconds: float, index: int = 0) -> str:
    """Up to three runs per name at once."""
    return _slot_section(name, seconds, 3)


@app.task(base=LockedTask, bind=True, lock_keys=["name"], lock_limit=2, lock_scope="queue")
def limited_queued(self: Any, name: str, index: int = 0) -> str:
    """Queue scope with two slots: two calls may be queued or running at once."""
    return str(self.request.id)


def _follow_section(name: str, seconds: float, value: int) -> int:
    """Record a run of ``name`` (its value, its fencing token, and any overlap); then sleep
    ``seconds``, or with a negative number until the test sets ``gate:<name>`` (60 s at
    most), so a test orders calls by its own moves, not by a body's length."""
    r = data()
    lock = current_lock()
    if r.incr(f"inside:{name}") > 1:
        r.incr(f"over:{name}")
    with r.pipeline(transaction=True) as record:  # one step: a revoke lands before or after
        record.rpush(f"values:{name}", value)
        record.rpush(f"fences:{name}", lock.fencing_token if lock is not None else -1)
        record.rpush(f"pids:{name}", os.getpid())
        record.execute()
    if seconds >= 0:
        time.sleep(seconds)
    else:
        deadline = time.monotonic() + 60
        while not r.exists(f"gate:{name}") and time.monotonic() < deadline:
            time.sleep(0.02)
    r.decr(f"inside:{name}")
    return value


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="coalesce")
def coalesced(name: str, seconds: float, value: int) -> int:
    """Keep latest: calls made while one is queued or running become one follow-up."""
    return _follow_section(name, seconds, value)


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="replace")
def replaced(name: str, seconds: float, value: int) -> int:
    """Replace: a new call supersedes a queued one, or follows a running one."""
    return _follow_section(name, seconds, value)


# A worker whose pool cannot stop a running task (solo, threads) refuses to start with a
# task that asks for lock_replace_running, so such a worker of this project leaves it off.
_REPLACES_RUNNING = os.environ.get("CSL_WORKER_POOL", "prefork") == "prefork"


# Not shared with other apps (Celery adds an @app.task to every app finalized later): an
# in-process solo worker of another test's app would refuse it.
@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_on_conflict="replace",
          lock_replace_running=_REPLACES_RUNNING, shared=False)  # fmt: skip
def replaced_running(name: str, seconds: float, value: int) -> int:
    """Replace, running holders included: the running one is revoked."""
    return _follow_section(name, seconds, value)


def _debounced_run(name: str, value: int) -> int:
    """Record a debounced run: its value and when it started."""
    data().rpush(f"runs:{name}", f"{value} {time.time():.3f}")
    return value


@app.task(base=LockedTask, lock_keys=["name"], lock_debounce=2.0)
def debounced(name: str, value: int) -> int:
    """Run once per burst of calls, 2 s after the last, with its value (a quiet time that a
    busy machine's calls 0.1 s apart do not outlast)."""
    return _debounced_run(name, value)


@app.task(base=LockedTask, lock_keys=["name"], lock_debounce=0.4, lock_debounce_max_wait=1.0)
def debounced_capped(name: str, value: int) -> int:
    """As debounced, but a burst never waits more than 1 s after its first call."""
    return _debounced_run(name, value)


@app.task(base=LockedTask, lock_keys=["name"], lock_scope="queue", lock_debounce=2.0)
def debounced_queued(name: str, value: int) -> int:
    """Debounce in queue scope."""
    return _debounced_run(name, value)


@app.task(base=LockedTask, lock_keys=["name"], lock_renew=False, lock_timeout=60.0)
def unrenewed(name: str, seconds: float) -> str:
    """A long run whose lease is never renewed (only a live worker vouches for it)."""
    data().rpush(f"started:{name}", os.getpid())
    time.sleep(seconds)
    return "ran"


@app.task(base=LockedTask, bind=True, lock_scope="queue", lock_timeout=1.0, max_retries=3)
def retry_in_outage(self: Any, name: str) -> str:
    """Queue scope: the first attempt waits for the test's go (the test stops the lock
    Redis meanwhile), then calls self.retry(); the second attempt must still run."""
    r = data()
    attempt = r.incr(f"attempts:{name}")
    if attempt == 1:
        r.rpush(f"events:{name}", "waiting")
        deadline = time.monotonic() + 30
        while not r.exists(f"go:{name}") and time.monotonic() < deadline:
            time.sleep(0.05)
        raise self.retry(countdown=0.5)
    return f"attempt {attempt}"


@app.task(base=LockedTask, bind=True, lock_keys=["name"], autoretry_for=(ValueError,),
          max_retries=2, default_retry_delay=0.2)  # fmt: skip
def autoretried(self: Any, name: str) -> str:
    """Fails twice with ValueError (autoretry, max_retries=2), succeeds the third time: the
    lock's own retries (an outage) must not eat those two."""
    r = data()
    attempt = r.incr(f"attempts:{name}")
    r.rpush(f"retries:{name}", self.request.retries)
    if attempt < 3:
        raise ValueError(f"attempt {attempt}")
    return f"attempt {attempt}"

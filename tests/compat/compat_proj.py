"""The Celery app the compat tests run in real ``celery worker`` processes.

It is configured the way the two predecessors' users configure theirs: celery-singleton's
settings in old-style upper case, celery-once's ``ONCE`` dict put into ``app.conf`` with the
rest of a Flask-style upper-case configuration. Environment: ``CSL_COMPAT_BROKER`` (broker,
db 0), ``CSL_COMPAT_BACKEND`` (result backend, db 1: celery-singleton's locks live there),
``CSL_COMPAT_ONCE`` (celery-once's lock Redis, db 2), ``CSL_COMPAT_DATA`` (what the tasks
record, db 3), ``CSL_COMPAT_LEASE`` (our ``singleton_lock_timeout``).
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import current_lock
from celery_singleton_lock.compat.once import QueueOnce
from celery_singleton_lock.compat.singleton import Singleton

BROKER = os.environ.get("CSL_COMPAT_BROKER", "redis://127.0.0.1:6399/0")
BACKEND = os.environ.get("CSL_COMPAT_BACKEND", "redis://127.0.0.1:6399/1")

app = Celery("compat_proj", broker=BROKER, backend=BACKEND)
app.conf.update(
    {
        # A Flask app's config handed to Celery as it is (upper-case keys).
        "DEBUG": False,
        "SECRET_KEY": "not-a-secret",
        "ONCE": {
            "backend": "celery_once.backends.Redis",
            "settings": {
                "url": os.environ.get("CSL_COMPAT_ONCE", "redis://127.0.0.1:6399/2"),
                "default_timeout": 60,
            },
        },
        "CELERY_SINGLETON_KEY_PREFIX": "compat_",
        "SINGLETON_LOCK_TIMEOUT": float(os.environ.get("CSL_COMPAT_LEASE") or 30),
    }
)
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    # Tests stop their Redis at the end: do not retry the result backend for minutes then.
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)

_data: redis.Redis | None = None
_data_pid = 0


def data() -> redis.Redis:
    """A client of the data Redis for this process (recreated after fork)."""
    global _data, _data_pid  # noqa: PLW0603 - one lazily built client per process
    if _data is None or _data_pid != os.getpid():
        _data = redis.Redis.from_url(os.environ.get("CSL_COMPAT_DATA", BROKER))
        _data_pid = os.getpid()
    return _data


def record(name: str, seconds: float = 0.0) -> None:
    """Log the start and end of a run of ``name`` and whether it overlapped another."""
    r = data()
    if r.incr(f"inside:{name}") > 1:
        r.incr(f"overlaps:{name}")
    r.rpush(f"events:{name}", f"start {time.time():.6f}")
    time.sleep(seconds)
    r.rpush(f"events:{name}", f"end {time.time():.6f}")
    r.decr(f"inside:{name}")


@app.task(base=Singleton)
def s_sleep(name: str, seconds: float = 0.0) -> str:
    """celery-singleton's default task: one queued or running per arguments."""
    record(name, seconds)
    return name


@app.task(base=Singleton)
def s_fail(name: str) -> None:
    """Fails: the lock must still be released."""
    record(name)
    raise ValueError(name)


@app.task(base=Singleton, lock_expiry=1)
def s_expiry(name: str, seconds: float = 3.0) -> str:
    """Runs longer than its one-second lock_expiry."""
    record(name, seconds)
    return name


def _retry_once(task: Any, name: str) -> str:
    r = data()
    attempt = r.incr(f"attempts:{name}")
    lock = current_lock()
    r.rpush(f"held:{name}", int(bool(lock is not None and lock.owned())))
    if attempt == 1:
        raise task.retry(countdown=1.5)
    return f"attempt {attempt}"


@app.task(base=Singleton, bind=True, max_retries=3)
def s_retry(self: Any, name: str) -> str:
    """Retries itself once: the retry goes through and keeps the lock."""
    return _retry_once(self, name)


@app.task(base=QueueOnce)
def o_sleep(name: str, seconds: float = 0.0) -> str:
    """celery-once's default task."""
    record(name, seconds)
    return name


@app.task(base=QueueOnce)
def o_fail(name: str) -> None:
    """Fails: the lock must still be cleared."""
    record(name)
    raise ValueError(name)


@app.task(base=QueueOnce, once={"unlock_before_run": True})
def o_unlock(name: str, seconds: float = 2.0) -> str:
    """Gives its lock up just before the body runs."""
    lock = current_lock()
    data().rpush(f"held:{name}", int(lock is not None))
    record(name, seconds)
    return name


@app.task(base=QueueOnce, bind=True, max_retries=3)
def o_retry(self: Any, name: str) -> str:
    """Retries itself once: the re-publish is not refused, the lock stays held."""
    return _retry_once(self, name)


@app.task(base=QueueOnce, bind=True, max_retries=3)
def o_switch(self: Any, name: str, step: int = 1) -> int:
    """Retries itself with other arguments, so the retry needs a key of its own."""
    data().rpush(f"steps:{name}", step)
    if step == 1:
        raise self.retry(args=(name, 2), kwargs={}, countdown=0.2)
    return step


@app.task(base=QueueOnce)
def o_long(name: str) -> str:
    """Runs long enough to have its pool process killed."""
    record(name, 30.0)
    return name


_inside: contextvars.ContextVar[str | None] = contextvars.ContextVar("inside", default=None)


def make_context_base(label: str) -> type[QueueOnce]:
    """celery-once's Flask recipe: a QueueOnce subclass, made in a factory, whose
    ``__call__`` wraps the body in a context (here a context variable, there an app
    context)."""

    @contextmanager
    def context() -> Iterator[None]:
        token = _inside.set(label)
        try:
            yield
        finally:
            _inside.reset(token)

    class ContextQueueOnce(QueueOnce):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with context():
                return super().__call__(*args, **kwargs)

    return ContextQueueOnce


@app.task(base=make_context_base("flask-like"))
def o_context(name: str) -> str:
    """Records whether it ran inside its base class's context and under its lock."""
    lock = current_lock()
    info = {"inside": _inside.get(), "locked": lock is not None and lock.owned()}
    data().rpush(f"context:{name}", json.dumps(info))
    record(name, 0.5)
    return name

"""A periodic job that takes longer than its period, deduplicated two ways.

Beat sends ``refresh_report`` every second, but a refresh takes three. Without a lock the
runs overlap (or, on a busy worker, the ticks pile up in the queue and run back to back
for ever). Two ways out, one per task:

* :func:`refresh_report` uses ``lock_scope="queue"``: the lock is taken when beat
  *publishes* the tick and held until that run ends, so a tick while one is queued or
  running publishes nothing. This needs beat to import this module (``celery -A
  examples.beat_dedup.tasks beat``): the lock is taken in ``apply_async``.
* :func:`refresh_report_by_name` uses the default run scope with ``skip``: the beat of
  :mod:`examples.beat_dedup.beat_by_name` knows the task only by its name and publishes
  every tick; the worker skips a tick whose job is still running. Nothing piles up as long
  as the worker has a free pool process to receive (and skip) the tick.

Configured from the environment (see :mod:`examples.beat_dedup.config`). Each run records
its start and end in Redis for the run script.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, signals

from celery_singleton_lock import LockedTask
from examples.beat_dedup.config import EVERY, JOB_SECONDS, NAMESPACE, REDIS_URL, celery_settings

app = Celery("beat_dedup")
app.conf.update(
    celery_settings(),
    beat_schedule={
        "refresh-report": {"task": "examples.beat_dedup.tasks.refresh_report", "schedule": EVERY}
    },
)

_client: redis.Redis | None = None


def store() -> redis.Redis:
    """A client of the Redis where runs are recorded (made in each pool process)."""
    global _client  # noqa: PLW0603 - one lazily made client per process
    if _client is None:
        _client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
    return _client


def job(variant: str) -> None:
    """The periodic work: record the start, work ``JOB_SECONDS``, record the end."""
    runs = f"{NAMESPACE}:runs:{variant}"
    store().rpush(runs, f"start {time.time():.6f} {os.getpid()}")
    time.sleep(JOB_SECONDS)
    store().rpush(runs, f"end {time.time():.6f} {os.getpid()}")


@app.task(base=LockedTask, lock_scope="queue")
def refresh_report() -> None:
    """Queue scope: a tick while a refresh is queued or running publishes nothing."""
    job("queue")


@app.task(base=LockedTask)
def refresh_report_by_name() -> None:
    """Run scope, skip: a tick that arrives while a refresh runs does nothing."""
    job("by_name")


VARIANTS = {refresh_report.name: "queue", refresh_report_by_name.name: "by_name"}


@signals.task_prerun.connect
def _delivered(task: Any = None, **_: Any) -> None:
    """Count every message that reached a worker, run or skipped."""
    variant = VARIANTS.get(getattr(task, "name", ""))
    if variant is not None:
        store().incr(f"{NAMESPACE}:delivered:{variant}")

"""A Celery project for the first-contact tests: configured from the environment so a test
can start a real worker with a typo or a bad value in any place a user can make one.

``CSL_BROKER_URL`` (broker), ``CSL_LOCK_URL`` (lock Redis), ``CSL_EXTRA_CONF`` (JSON merged
into ``app.conf``), ``CSL_DJANGO_CONF`` (JSON read Django-style with the ``CELERY``
namespace), ``CSL_TYPO_TASK=1`` (define a task whose decorator has a misspelt option).
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, current_lock

BROKER = os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6399/0")

app = Celery("contact", broker=BROKER, backend=os.environ.get("CSL_BACKEND_URL") or None)
django_conf = json.loads(os.environ.get("CSL_DJANGO_CONF") or "{}")
if django_conf:
    app.config_from_object(SimpleNamespace(**django_conf), namespace="CELERY")
app.conf.update(
    broker_url=BROKER,
    singleton_lock_url=os.environ.get("CSL_LOCK_URL") or None,
    task_default_queue=os.environ.get("CSL_QUEUE", "csl-contact"),
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    # Tests stop their Redis at the end: do not retry the result backend for minutes then.
    result_backend_transport_options={"retry_policy": {"max_retries": 2, "interval_max": 0.2}},
)
app.conf.update(json.loads(os.environ.get("CSL_EXTRA_CONF") or "{}"))

_data: redis.Redis | None = None


def data() -> redis.Redis:
    """A client of the data Redis (the broker's server) for this process."""
    global _data  # noqa: PLW0603 - one lazily built client per process (prefork children fork before use)
    if _data is None:
        _data = redis.Redis.from_url(os.environ.get("CSL_DATA_URL", BROKER))
    return _data


@app.task(base=LockedTask, bind=True, max_retries=None)
def probe(self: Any, name: str, seconds: float = 0.0, note: str = "") -> dict[str, Any]:
    """Report how this run is locked (key, lease, renewal, retries), then sleep."""
    lock = current_lock()
    report = {
        "key": lock.name if lock else None,
        "timeout": lock.timeout if lock else None,
        "renew": lock.auto_renew if lock else None,
        "retries": self.request.retries,
        "note": note,
    }
    data().rpush(f"probe:{name}", json.dumps(report))
    time.sleep(seconds)
    return report


@app.task
def plain(x: str) -> str:
    """A task with no lock of its own (``singleton_lock_tasks`` may lock it)."""
    return x


if os.environ.get("CSL_TYPO_TASK") == "1":

    @app.task(base=LockedTask, lock_timout=5)
    def misspelt(x: str) -> str:
        """Its decorator misspells lock_timeout: the worker must refuse to start."""
        return x

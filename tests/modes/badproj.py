"""A Celery project whose lock options do not go together, chosen by ``CSL_MODES_BAD``: a
worker of it must refuse to start. ``plain`` is an unlocked task to leave a message in the
queue (the worker must not consume it)."""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock import LockedTask

URL = os.environ.get("CSL_MODES_URL", "redis://127.0.0.1:6399/0")
BAD = os.environ.get("CSL_MODES_BAD", "")
QUEUE = "csl-modes-bad"

app = Celery("badproj", broker=URL)
app.conf.update(
    singleton_lock_url=URL,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)
if BAD == "bad-rate":
    app.conf.singleton_lock_tasks = {"badproj.*": {"lock_rate_limit": "10/y"}}


@app.task(name="plain")
def plain() -> str:
    """Not locked: published by the test to check that nothing is consumed."""
    return "ran"


@app.task(name="badproj.configured")
def configured() -> str:
    """Locked through ``singleton_lock_tasks`` (with a bad rate under ``bad-rate``)."""
    return "ran"


if BAD == "start-in-run":

    @app.task(name="badproj.sync", base=LockedTask, lock_release="start")
    def sync() -> str:
        """lock_release="start" in run scope: nothing to free at the start."""
        return "ran"


if BAD == "hold-without-success":

    @app.task(name="badproj.held", base=LockedTask, lock_scope="queue", lock_hold=30)
    def held() -> str:
        """lock_hold without lock_release="success"."""
        return "ran"

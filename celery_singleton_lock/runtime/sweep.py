"""The worker sweep: every worker of an app whose tasks set calls aside in the lock Redis
(``ConflictPolicy.keeps_calls``: park, coalesce, replace), now and then, makes sure none of
those calls is lost.

Each policy says what its sweep of a key does (``ConflictPolicy.sweep``). Park: a call
handed its key but not started within ``GRANT_RESTART`` (its releasing process died before
publishing it, or the message was lost) is published again — a second copy of a call that
does start runs once, by the one-delivery rule — and a free key (its holder died without
releasing, a success hold ran out) goes to the first parked call. Coalesce and replace: a
follow-up left behind beside a free key (its holder died, or could not hand it over while
Redis erred, until its lease ran out) is handed the key. The sweep goes through the keys
named in the prefix's list (``modes.parking.parking_index``); a key with nothing set aside
any more leaves it.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockError
from celery_singleton_lock.modes.parking import INDEX_KEEP, parking_index
from celery_singleton_lock.runtime.context import publish_past_lock
from celery_singleton_lock.runtime.locking import locking_for

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["SWEEP_INTERVAL", "Sweeper", "sweep"]

log = logging.getLogger("celery_singleton_lock.worker")
#: Jitter draws from the OS, not the global ``random``: the application's seeded state is
#: left alone, and forked pool processes do not share one sequence.
_RANDOM = random.SystemRandom()

#: Seconds between two sweeps of a worker (with up to a fifth more, so workers spread out).
SWEEP_INTERVAL = 3.0
#: The most keys one sweep looks at.
SWEEP_KEYS = 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sweep(app: Celery) -> int:
    """One sweep of ``app``'s keys with calls set aside; how many calls it published."""
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    index = parking_index(settings.prefix)
    published = 0
    seconds, _ = (int(part) for part in call(index, client.time))
    for member in call(index, client.zrange, index, 0, SWEEP_KEYS - 1):
        task_name, _, key = _text(member).partition("\n")
        task = app.tasks.get(task_name)
        if task is None:
            continue  # a task this worker does not know: a worker that does sweeps it
        locking = locking_for(task)
        if locking is None:
            continue
        swept = locking.plan.policy.sweep(client, key, locking.options)
        for handed in swept.calls:
            log.warning(
                "%s[%s]: handed %s by the sweep; publishing it", task_name, handed.task_id, key
            )
            publish_past_lock(task, locking, key, handed)
            published += 1
        if not swept.active:  # unless named again lately (a call about to set one aside)
            atomic.index_drop(client, index, _text(member), before=seconds - INDEX_KEEP)
    return published


class Sweeper:
    """A daemon thread of a worker's main process that sweeps ``app`` every
    ``SWEEP_INTERVAL`` seconds (a sweep that fails is logged and tried again later)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="csl-park-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(SWEEP_INTERVAL * _RANDOM.uniform(1.0, 1.2)):
            try:
                sweep(self.app)
            except (LockError, OSError) as exc:
                log.warning("park sweep failed, trying again: %s", exc)
            except Exception:  # a sweep must never end the worker
                log.exception("park sweep failed")

"""The worker sweep: every worker of an app whose tasks set calls aside in the lock Redis
(``ConflictPolicy.keeps_calls``: park, coalesce, replace; and calls held back by a stacked
limit or a rate, ``modes.held``), now and then, makes sure none of those calls is lost.

Each policy says what its sweep of a key does (``ConflictPolicy.sweep``). Park: a call
handed its key but not started within ``GRANT_RESTART`` (its releasing process died before
publishing it, or the message was lost) is published again — a second copy of a call that
does start runs once, by the one-delivery rule — and a free key (its holder died without
releasing, a success hold ran out) goes to the first parked call. Coalesce and replace: a
follow-up left behind beside a free key (its holder died, or could not hand it over while
Redis erred, until its lease ran out) is handed the key. The sweep goes through the keys
named in the prefix's list (``modes.parking.parking_index``); a key with nothing set aside
any more leaves it.

Held-back calls (``modes.held``) live under the app's stack base: the sweep publishes those
that fit now, those whose window opened, and those handed out ``HELD_RESTART`` ago that never
started. Their sweep is also woken: the worker blocks on the list a release of a share
pushes onto (``held:wake``), and wakes when the next held call's window opens, so a held
call does not wait for the next periodic sweep.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.rules import poll_cap
from celery_singleton_lock.engine.stack import HELD_WAKE, stack_base
from celery_singleton_lock.engine.wire import call, socket_timeout
from celery_singleton_lock.exceptions import LockError
from celery_singleton_lock.modes import held
from celery_singleton_lock.modes.parking import INDEX_KEEP, decode_call, parking_index
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import publish_past_lock
from celery_singleton_lock.runtime.locking import locking_for

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["SWEEP_INTERVAL", "Sweeper", "holding_tasks", "sweep", "sweep_held"]

log = logging.getLogger("celery_singleton_lock.worker")
#: Jitter draws from the OS, not the global ``random``: the application's seeded state is
#: left alone, and forked pool processes do not share one sequence.
_RANDOM = random.SystemRandom()

#: Seconds between two sweeps of a worker (with up to a fifth more, so workers spread out).
SWEEP_INTERVAL = 3.0
#: The most keys one sweep looks at.
SWEEP_KEYS = 1000
#: The most looks one sweep of held-back calls takes (each hands out at most
#: ``modes.held.SWEEP_MOST``).
SWEEP_ROUNDS = 10


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


def holding_tasks(app: Celery) -> tuple[str, ...]:
    """The names of ``app``'s locked tasks, when one of them can hold calls back in the lock
    Redis (``modes.held``); else none. The sweep of held calls hands out only calls of
    these (a worker of another app with the same prefix leaves the others to theirs)."""
    locked = {name: locking_for(task) for name, task in list(app.tasks.items())}
    names = tuple(sorted(name for name, locking in locked.items() if locking is not None))
    holds = any(
        locking is not None and held.holds_back(locking.options) for locking in locked.values()
    )
    return names if holds else ()


def sweep_held(app: Celery, tasks: tuple[str, ...]) -> tuple[int, float | None]:
    """One sweep of ``app``'s held-back calls (of ``tasks``): publish those handed out now;
    how many, and the seconds until the next one's window opens (None: none waits for one)."""
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    found_calls: list[atomic.HeldCall] = []
    for _ in range(SWEEP_ROUNDS):  # more than one look's worth fits: look again at once
        swept = atomic.held_sweep(
            client,
            stack_base(settings.prefix),
            restart_ms=int(held.HELD_RESTART * 1000),
            place_ms=int(held.PLACE_KEEP * 1000),
            travel_ms=int(held.TRAVEL_KEEP * 1000),
            most=held.SWEEP_MOST,
            tasks=tasks,
        )
        found_calls += swept.calls
        if len(swept.calls) < held.SWEEP_MOST:
            break
    published = 0
    for found in found_calls:
        task_name, handed = decode_call(found.task_id, found.payload)
        task = app.tasks.get(task_name)
        if task is None:
            continue  # not this worker's (filtered out by the script already)
        options = {**handed.options, hdr.REPUBLISH_OPTION: {hdr.HEADER_KEY: found.key}}
        try:
            task.apply_async(handed.args, handed.kwargs, task_id=handed.task_id, **options)
        except Exception:  # a later sweep hands it out again
            log.exception("could not publish %s[%s], held back; a later sweep will", task_name,
                          handed.task_id)  # fmt: skip
            continue
        log.info("%s[%s]: published, its limits have room (or its window opened)", task_name,
                 handed.task_id)  # fmt: skip
        published += 1
    return published, swept.next_due


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
        tasks = holding_tasks(self.app)
        next_full = time.monotonic() + self._interval()
        due_at: float | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            deadline = next_full if due_at is None else min(next_full, due_at)
            woke = False
            try:
                if tasks:
                    woke = self._wait_wake(deadline - now)
                elif self._stop.wait(max(0.0, deadline - now)):
                    return
                if self._stop.is_set():
                    return
                now = time.monotonic()
                if now >= next_full:
                    next_full = now + self._interval()
                    sweep(self.app)
                if tasks and (woke or now >= deadline):
                    _, due = sweep_held(self.app, tasks)
                    due_at = None if due is None else time.monotonic() + due
            except (LockError, OSError) as exc:
                log.warning("park sweep failed, trying again: %s", exc)
                next_full = self._after_failure()
            except Exception:  # a sweep must never end the worker
                log.exception("park sweep failed")
                next_full = self._after_failure()

    def _after_failure(self) -> float:
        """Wait one interval after a failed sweep (the lock Redis may be down); when the
        next full sweep is due."""
        self._stop.wait(self._interval())
        return time.monotonic()

    @staticmethod
    def _interval() -> float:
        return SWEEP_INTERVAL * _RANDOM.uniform(1.0, 1.2)

    def _wait_wake(self, seconds: float) -> bool:
        """Block until a release of a share wakes the sweep of held calls, or ``seconds``
        pass (at most the client's poll cap: a BLPOP never outlasts its socket timeout).
        Whether it was woken."""
        if seconds <= 0.01:
            return False
        settings = settings_for(self.app)
        client = redis_for(self.app, settings.url)
        wake = stack_base(settings.prefix) + HELD_WAKE
        block = min(seconds, poll_cap(SWEEP_INTERVAL, socket_timeout(client)))
        return call(wake, client.blpop, [wake], timeout=block) is not None

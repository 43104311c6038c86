"""What the modes of issue 16 add to a locked run: the cluster-wide throttle
(``lock_rate_limit``) and the lifetimes (``lock_release``, ``lock_hold``).

:mod:`.runtime` calls in here at three points of a run, each a single line there:

- :func:`admit`, once the run holds its key: under ``lock_rate_limit`` it records the start
  (one script, on the server clock) or, over the limit, gives the key back and applies the
  conflict policy to the throttled run;
- :func:`release_at_start`, as the body starts, under ``lock_release="start"``;
- :func:`hold_after_success`, as a successful run ends, under ``lock_release="success"``:
  the run's hold becomes a hold of ``lock_hold`` seconds that nobody renews.

The scripts are in :mod:`._mode_scripts`; ``docs/modes.md`` says what each mode promises.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import RedisLock, _mode_scripts, companion_key
from celery_singleton_lock.engine.scripted import _Script
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned, TaskThrottled
from celery_singleton_lock.options import parse_rate

if TYPE_CHECKING:
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "STARTED_ATTR",
    "admit",
    "hold_after_success",
    "next_start",
    "release_at_start",
    "released_at_start",
    "starts_key",
]

log = logging.getLogger("celery_singleton_lock.task")

_THROTTLE = _Script(_mode_scripts.THROTTLE)
_HOLD = _Script(_mode_scripts.HOLD)
#: Attribute of a run's request naming the key it freed as its body started.
STARTED_ATTR = "singleton_lock_released_at_start"
#: A throttle that cannot reach Redis retries after at most this many seconds.
_OUTAGE_COUNTDOWN = 5.0
#: A throttled retry comes back at the next free start plus up to this share of the wait
#: (at most a second), so retries that wait for the same start do not all arrive together.
_RETRY_SPREAD = 0.1
#: Waiting for the next free start sleeps this much longer than the server said.
_WAIT_MARGIN = 0.002


def starts_key(key: str) -> str:
    """The sorted set of recent starts of lock ``key`` (same Redis Cluster hash slot)."""
    return companion_key(key, _mode_scripts.STARTS_SUFFIX)


def next_start(lock: RedisLock, task_id: str, rate: str) -> float | None:
    """Record a start of ``lock``'s key if ``rate`` allows one now: None when it was
    admitted (and recorded), else the seconds until a start would be. One round trip."""
    limit, window_ms = parse_rate(rate)
    reply = call(
        lock.name, _THROTTLE, lock.client, 1, starts_key(lock.name), limit, window_ms, task_id
    )
    return None if int(reply[0]) == 1 else int(reply[1]) / 1000


def _give_back(lock: RedisLock) -> None:
    """Release ``lock`` (owner-checked); a throttled run never keeps its key."""
    try:
        lock.release()
    except LockNotOwned:
        log.warning("lock %s was lost before the throttled run gave it back", lock.name)
    except LockBackendError as exc:
        log.error("could not give back lock %s after a throttle: %s", lock.name, exc)


def _hand_back(lock: RedisLock, queued: Callable[[], RedisLock]) -> None:
    """Queue scope: hand the run's hold back to its message, as a queued hold under the
    message's token (fencing token kept), so a duplicate published while the throttled
    message waits still finds it; released instead when that fails."""
    try:
        if queued().acquire(blocking=False):
            lock.detach()
            return
    except LockBackendError as exc:
        log.warning("could not hand lock %s back to its message: %s", lock.name, exc)
    _give_back(lock)


def admit(
    task: Any,
    lock: RedisLock,
    key: str,
    options: LockOptions,
    *,
    started: float,
    fail_open: bool,
    prefix: str,
    retry: Callable[..., BaseException],
    queued: Callable[[], RedisLock],
) -> bool:
    """Whether the run that holds ``lock`` may start under ``lock_rate_limit``.

    True: the start was recorded (or there is no rate). Over the limit the run gives its
    key back and applies its conflict policy: ``skip`` returns False (the body does not
    run); ``retry`` raises ``retry(TaskThrottled, countdown to the next free start)``
    (queue scope: the key goes back to the retried message; an eager run sleeps the
    countdown instead, as Celery would re-run it at once); ``raise`` raises
    ``TaskThrottled``; ``wait`` keeps the key and sleeps until the next free start, if that
    comes within ``lock_wait`` of ``started`` (else gives the key back and raises).
    ``retry(exc, countdown, **options)`` is the runtime's retry of this run; ``queued()``
    makes the queued lock of this run's message (queue scope).
    """
    rate = options.rate_limit
    if rate is None:
        return True
    request = task.request
    task_id = str(request.id)
    deadline = None if options.wait is None else started + options.wait
    told = False
    while True:
        try:
            retry_in = next_start(lock, task_id, rate)
        except LockBackendError as exc:
            if fail_open:
                log.warning(
                    "singleton lock throttle unavailable for %s[%s] (%s): starting UNTHROTTLED "
                    "because singleton_lock_fail_open is set", task.name, task_id, exc,
                )  # fmt: skip
                return True
            log.error("singleton lock throttle unavailable for %s[%s]: %s; retrying",
                      task.name, task_id, exc)  # fmt: skip
            _give_back(lock)
            countdown = min(_OUTAGE_COUNTDOWN, options.timeout) * (1 + random.uniform(0, 0.25))
            raise retry(exc, countdown, max_retries=int(request.retries or 0) + 1) from exc
        if retry_in is None:
            return True
        policy = options.on_conflict
        if policy == "skip" and request.retries:
            policy = "retry"  # a retried run is the work itself: skipping would drop it
        if not told:
            observe.throttled(
                task, key, task_id, policy=policy, scope=options.scope, rate=rate,
                retry_in=retry_in,
            )  # fmt: skip
            told = True
        if policy == "retry" and request.is_eager:
            # Celery runs an eager retry at once, whatever its countdown: it would be
            # throttled again and again. Sit out the countdown here instead.
            time.sleep(retry_in + _WAIT_MARGIN)
            continue
        if policy == "wait":
            left = None if deadline is None else deadline - time.monotonic()
            if left is None or retry_in <= left:
                time.sleep(retry_in + _WAIT_MARGIN)  # holding the key: same-key runs queue up
                continue
            _give_back(lock)
            raise TaskThrottled(key, retry_in)
        if policy == "retry":
            if options.scope == "queue":
                _hand_back(lock, queued)
            else:
                _give_back(lock)
            countdown = retry_in + random.uniform(0, min(retry_in * _RETRY_SPREAD, 1.0))
            raise retry(TaskThrottled(key, retry_in), countdown)
        _give_back(lock)
        if policy == "skip":
            observe.skipped(
                task, lock.client, prefix=prefix, key=key, task_id=task_id,
                holder_task_id=None, reason="throttled",
            )  # fmt: skip
            return False
        raise TaskThrottled(key, retry_in)


def release_at_start(task: Any, lock: RedisLock, task_id: str, options: LockOptions) -> None:
    """``lock_release="start"``: free the key as the body starts (queue scope), so a call
    made from now on publishes a new message."""
    setattr(task.request, STARTED_ATTR, lock.name)
    try:
        lock.release()
    except LockNotOwned:
        log.warning("lock %s of task %s had expired before its body started", lock.name, task_id)
        observe.lost(task, lock, task_id, options)
    except LockBackendError as exc:
        log.error("could not release lock %s of task %s at its start: %s (it frees at its "
                  "lease end)", lock.name, task_id, exc)  # fmt: skip
    else:
        observe.released(task, lock, task_id, options, "STARTED")


def released_at_start(task: Any, key: str, task_id: str) -> bool:
    """Whether the run in progress is ``task_id`` and freed ``key`` as its body started
    (its own ``self.retry()`` must then be published whoever holds the key now)."""
    request = task.request
    return getattr(request, STARTED_ATTR, None) == key and str(request.id) == task_id


def _held_info(holder_info: str) -> str:
    """The holder info of a success hold: the run's, marked ``"held": "success"`` and
    without its pid (no process runs it any more, so nobody frees it for a lost process)."""
    try:
        info = json.loads(holder_info)
    except ValueError:
        return holder_info
    if not isinstance(info, dict):
        return holder_info
    info.pop("pid", None)
    info["held"] = "success"
    return json.dumps(info, sort_keys=True, separators=(",", ":"))


def hold_after_success(
    task: Any,
    lock: RedisLock,
    task_id: str,
    options: LockOptions,
    record: tuple[str, str, int] | None,
) -> bool:
    """``lock_release="success"``: keep the key of the successful run ``task_id`` for
    ``lock_hold`` seconds from now (server clock), owner-checked, unrenewed, naming that
    task id (so a queue-scope duplicate gets its ``AsyncResult``). ``record`` (queue
    scope) is written in the same step, as a release writes it. Returns whether the run's
    hold is dealt with; False (a Redis error) leaves it to the ordinary release."""
    if options.release != "success" or options.hold is None:
        return False
    token = lock.token
    if token is None:
        return False
    hold_ms = max(1, round(options.hold * 1000))
    keys: tuple[str, ...] = (lock.name,)
    args: tuple[str | int, ...] = (token, hold_ms, _held_info(lock.holder_info))
    if record is not None:
        keys += (record[0],)
        args += (record[1], record[2])
    try:
        expiry = call(lock.name, _HOLD, lock.client, len(keys), *keys, *args)
    except LockBackendError as exc:
        log.error("could not hold lock %s after task %s succeeded: %s", lock.name, task_id, exc)
        return False
    lock.detach()
    if not expiry:
        log.warning("lock %s of task %s had expired before the run ended", lock.name, task_id)
        observe.lost(task, lock, task_id, options)
        return True
    observe.released(task, lock, task_id, options, "SUCCESS", hold=options.hold)
    return True

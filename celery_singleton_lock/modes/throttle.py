"""``lock_rate_limit="N/T"``: a cluster-wide throttle, at most N starts per key in any window
of T (sliding, on the Redis server's clock).

Once a run holds its key, one engine script records its start, or says how long until a
start would fit (``engine.atomic.throttle``). Over the limit the run applies its conflict
policy (:meth:`~.base.ConflictPolicy.throttled`): ``skip`` ends it, ``retry`` comes back when
the window frees, ``wait`` sleeps until then holding the key, ``raise`` fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import STARTS, companion_key
from celery_singleton_lock.exceptions import LockBackendError
from celery_singleton_lock.modes.base import Mode
from celery_singleton_lock.modes.policies import jitter
from celery_singleton_lock.options import Combination, no_scripts, parse_rate

if TYPE_CHECKING:
    from celery_singleton_lock.engine import RedisLock
    from celery_singleton_lock.modes.base import Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["Throttle", "next_start", "starts_key"]


def starts_key(key: str) -> str:
    """The sorted set of recent starts of lock ``key`` (same Redis Cluster hash slot)."""
    return companion_key(key, STARTS)


def next_start(lock: RedisLock, task_id: str, rate: str) -> float | None:
    """Record a start of ``lock``'s key if ``rate`` allows one now: None when it was
    admitted (and recorded), else the seconds until a start would be. One round trip."""
    limit, window_ms = parse_rate(rate)
    return atomic.throttle(lock.client, lock.name, limit=limit, window_ms=window_ms, member=task_id)


class Throttle(Mode):
    """``lock_rate_limit``."""

    name = "rate_limit"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, s: o.rate_limit is not None and no_scripts(s),
            "lock_rate_limit needs Lua scripts, which singleton_lock_scripting=False turns off",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.rate_limit is not None

    def busy_countdown(self, run: Run, countdown: float) -> float:
        """A run of a throttled key that found it busy comes back when its turn in the rate
        comes (the next free start, at least the rate's spacing), not after a backoff that
        grows with its retries: the rate sets the pace."""
        rate = run.options.rate_limit
        if rate is None:
            return countdown
        limit, window_ms = parse_rate(rate)
        try:
            wait = atomic.throttle_wait(run.client, run.key, limit=limit, window_ms=window_ms)
        except LockBackendError:
            return countdown
        spacing = window_ms / 1000 / limit
        return min(countdown, jitter(max(wait, spacing)))

    def admit(self, run: Run) -> bool:
        rate = run.options.rate_limit
        if rate is None:
            return True
        told = False
        while True:
            try:
                retry_in = next_start(run.lock, run.task_id, rate)
            except LockBackendError as exc:
                run.outage(exc, going_on="starting UNTHROTTLED")
                return True
            if retry_in is None:
                return True
            policy = run.policy
            if not told:
                observe.throttled(
                    run.task,
                    run.key,
                    run.task_id,
                    policy=policy.reported,
                    scope=run.options.scope,
                    rate=rate,
                    retry_in=retry_in,
                )
                told = True
            if not policy.throttled(run, retry_in):
                return False

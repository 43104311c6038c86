"""Exceptions raised by celery_singleton_lock.

Every exception shares one root, and every one survives a pickle round trip (Celery's
result backends serialise task exceptions)::

    SingletonLockError
    ├── LockError                 the Redis lock engine
    │   ├── LockNotOwned          release/extend by an instance that no longer holds the lock
    │   └── LockBackendError      Redis could not be reached or answered with an error
    │                             (also a redis.exceptions.RedisError)
    └── TaskLocked                a task's lock is held by another run
        └── TaskThrottled         a task's key used up its start rate (lock_rate_limit)

``LockBackendError`` is also redis-py's ``RedisError``, so code written for the projects
this package replaces (whose Redis errors reached the caller as they were) keeps catching
an unreachable lock Redis with ``except redis.RedisError``.

Wrong settings raise Celery's own ``celery.exceptions.ImproperlyConfigured``.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = [
    "LockBackendError",
    "LockError",
    "LockNotOwned",
    "SingletonLockError",
    "TaskLocked",
    "TaskThrottled",
]


class SingletonLockError(Exception):
    """Root of every exception this package raises."""


class LockError(SingletonLockError):
    """A lock operation failed; ``name`` is the Redis key of the lock."""

    def __init__(self, message: str = "", name: str | None = None) -> None:
        super().__init__(message, name)
        self.message = message
        self.name = name

    def __str__(self) -> str:
        return self.message if self.name is None else f"{self.message} (lock {self.name!r})"


class LockNotOwned(LockError):
    """The lock is not (or no longer) held by this instance: its lease ran out and
    another holder may have taken it, so nothing was released or extended."""


class LockBackendError(LockError, redis.RedisError):
    """Redis could not be reached, or refused a command; the lock state is unknown.

    Also a ``redis.exceptions.RedisError`` (``except redis.RedisError`` catches it, as it
    caught the Redis errors of celery-singleton and celery-once); the redis-py error it
    stands for is its ``__cause__``."""

    def __repr__(self) -> str:
        # redis-py's own repr ("server:LockBackendError") would hide the message in logs.
        return Exception.__repr__(self)


class TaskLocked(SingletonLockError):
    """Another run holds the lock for this task and these arguments.

    ``key`` is the Redis key of the lock; ``task_id`` is the holder's task id when known.
    """

    def __init__(self, key: str, task_id: str | None = None, message: str | None = None) -> None:
        text = message or (f"lock {key!r} is held" + (f" by task {task_id}" if task_id else ""))
        super().__init__(key, task_id, text)
        self.key = key
        self.task_id = task_id
        self.message = text

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.task_id, self.message))


class TaskThrottled(TaskLocked):
    """The key of this run used up its start rate (``lock_rate_limit``): the run did not
    start. A ``TaskLocked``, so code that handles a busy key handles this too.

    ``key`` is the Redis key of the lock; ``retry_in`` the seconds until the next start of
    that key would be admitted (None when unknown).
    """

    def __init__(self, key: str, retry_in: float | None = None, message: str | None = None) -> None:
        text = message or (
            f"lock {key!r} is throttled"
            + (f": next free start in {retry_in:.3f} s" if retry_in is not None else "")
        )
        super().__init__(key, None, text)
        self.args = (key, retry_in, text)  # what a result backend rebuilds it from
        self.retry_in = retry_in

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.retry_in, self.message))

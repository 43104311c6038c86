"""Exceptions raised by celery_singleton_lock.

Every exception shares one root, and every one survives a pickle round trip (Celery's
result backends serialise task exceptions)::

    SingletonLockError
    ├── LockError                 the Redis lock engine
    │   ├── LockNotOwned          release/extend by an instance that no longer holds the lock
    │   ├── LockLost              the lease of a held lock is gone while its holder works
    │   │                         (lock_on_lost="raise", RedisLock.ensure_held())
    │   ├── WeightAboveLimit      a hold's weight is above a stacked limit's number: it
    │   │                         can never fit (lock_limits, lock_weight)
    │   └── LockBackendError      Redis could not be reached or answered with an error
    │       │                     (also a redis.exceptions.RedisError)
    │       └── LockConnectionError   the compat shims' unreachable lock Redis
    │                                 (also a redis.exceptions.ConnectionError)
    ├── TaskLocked                a task's lock is held by another run
    │   └── TaskThrottled         a task's key used up its start rate (lock_rate_limit)
    └── ResultLost                a run finished once, but its result was never stored

``LockBackendError`` is also redis-py's ``RedisError``, so code written for the projects
this package replaces (whose Redis errors reached the caller as they were) keeps catching
an unreachable lock Redis with ``except redis.RedisError``; the compat shims raise
``LockConnectionError`` for it, also redis-py's ``ConnectionError``, as the originals'
``except redis.exceptions.ConnectionError`` handlers expect.

Wrong settings raise Celery's own ``celery.exceptions.ImproperlyConfigured``.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

__all__ = [
    "LockBackendError",
    "LockConnectionError",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "ResultLost",
    "SingletonLockError",
    "TaskLocked",
    "TaskThrottled",
    "WeightAboveLimit",
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


class LockLost(LockError):
    """The lease of a lock this code holds is gone (a renewal found it taken or expired, or
    its last confirmed lease ran out, as after a freeze or a partition): another holder may
    run now, so the work must stop. Raised by ``RedisLock.ensure_held()``, and inside a
    task's body under ``lock_on_lost="raise"`` as soon as the loss is known. A body that
    catches it may clean up, but must not write anything the lock protects."""

    def __init__(
        self, message: str = "the lease of the lock was lost", name: str | None = None
    ) -> None:
        if name is None:  # raised in this thread by another one: its lock named beforehand
            name = _async_lock_lost_names.pop(threading.get_ident(), None)
        super().__init__(message, name)


#: The lock names of ``LockLost`` raised asynchronously in a thread, by thread ident. A
#: thread that stops another thread's body (``lock_on_lost="raise"`` on the threads pool)
#: can only hand CPython the class; the target thread instantiates it with no arguments,
#: and ``LockLost.__init__`` takes the name left here by ``name_async_lock_lost``.
_async_lock_lost_names: dict[int, str] = {}


def name_async_lock_lost(thread: int, name: str | None) -> None:
    """Name the lock of the ``LockLost`` about to be raised asynchronously in ``thread``
    (``None``: withdraw a name not taken yet)."""
    if name is None:
        _async_lock_lost_names.pop(thread, None)
    else:
        _async_lock_lost_names[thread] = name


class WeightAboveLimit(LockError):
    """A hold's weight is above the number of one of its stacked limits, so it could never
    fit, however long it waited: the try is refused (a task fails with it, rather than
    waiting or coming back for ever). A number of 0 pauses a limit instead: no refusal.

    ``name`` is the Redis key of the lock; ``limit`` the limit's name, ``number`` its
    number as it applied then (set at run time with ``celery locks limit set``, else the
    code's) and ``weight`` the hold's weight (``lock_weight``).
    """

    def __init__(
        self, name: str | None = None, limit: str = "", number: int = 0, weight: int = 0
    ) -> None:
        message = (
            f"stacked limit {limit!r} allows a weight of {number} at once, but this run "
            f"weighs {weight}, so it can never fit (raise the limit's number in lock_limits "
            "or with `celery locks limit set`, or lower lock_weight)"
        )
        super().__init__(message, name)
        self.args = (name, limit, number, weight)  # what a result backend rebuilds it from
        self.limit = limit
        self.number = number
        self.weight = weight

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.limit, self.number, self.weight))


class LockBackendError(LockError, redis.RedisError):
    """Redis could not be reached, or refused a command; the lock state is unknown.

    Also a ``redis.exceptions.RedisError`` (``except redis.RedisError`` catches it, as it
    caught the Redis errors of celery-singleton and celery-once); the redis-py error it
    stands for is its ``__cause__``."""

    def __repr__(self) -> str:
        # redis-py's own repr ("server:LockBackendError") would hide the message in logs.
        return Exception.__repr__(self)


class LockConnectionError(LockBackendError, redis.exceptions.ConnectionError):
    """The lock Redis could not be reached (its ``__cause__`` is redis-py's
    ``ConnectionError``): a ``LockBackendError``, and also a
    ``redis.exceptions.ConnectionError``. The compat shims raise it from ``delay()`` and
    ``apply_async()`` where celery-singleton and celery-once let redis-py's
    ``ConnectionError`` through, so handlers written for them keep catching it."""


class TaskLocked(SingletonLockError):
    """Another run holds the lock for this task and these arguments.

    ``key`` is the Redis key of the lock; ``task_id`` is the holder's task id when known.
    ``explanation``, when the runtime could read it as the conflict happened, is why the
    key was held then: a plain dict (``Explanation.as_json()`` of
    :mod:`celery_singleton_lock.explain`: its holders, waiters, parked calls, follow-up,
    throttle and debounce burst, stacked limits), so it pickles and crosses a JSON result
    backend; read it back with ``Explanation.from_json(exc.explanation)``. None when not
    known.
    """

    def __init__(
        self,
        key: str,
        task_id: str | None = None,
        message: str | None = None,
        explanation: dict[str, Any] | None = None,
    ) -> None:
        text = message or (f"lock {key!r} is held" + (f" by task {task_id}" if task_id else ""))
        # A result backend rebuilds the exception from its args: the explanation goes there.
        super().__init__(key, task_id, text, *(() if explanation is None else (explanation,)))
        self.key = key
        self.task_id = task_id
        self.message = text
        self.explanation = explanation

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.task_id, self.message, self.explanation))


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


class ResultLost(SingletonLockError):
    """The run of this task id finished (its body ran once), but its result was never
    stored: its worker died between the end of the run and storing the result. A later
    copy of its message found the run recorded as finished, did not run it again, and
    stored this failure so that the call still ends in a visible state."""

    def __init__(self, task_id: str = "", key: str = "") -> None:
        super().__init__(task_id, key)
        self.task_id = task_id
        self.key = key

    def __str__(self) -> str:
        return (
            f"task {self.task_id} ran once under lock {self.key!r}, but its worker died "
            "before its result was stored; it is not run again"
        )

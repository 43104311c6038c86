"""Why a key blocks: who holds it, who waits for it, what is parked, pending, throttled or
debouncing there, read from the lock Redis on its own clock.

:func:`explain_key` reads one lock key and every companion a mode keeps beside it
(:mod:`.engine.keyspace`): the lock value (or, with ``lock_limit``, the slots the slot
index names, each checked against its value), the waiters' queue ``<base>queue`` and each
waiter's ``<base>waiter:<token>``, the park queue ``<base>parked`` with ``<base>parkdata``
and the calls handed the key ``<base>granted``, the pending follow-up ``<base>pending``, the
recent starts ``<base>starts`` (against the task's ``lock_rate_limit``), and the open burst
``<base>debounce`` with ``<base>burst:<id>`` and the done set. All the keys share the lock's
hash slot. It costs two round trips at most (one when the key has nothing but a holder; a
Redis Cluster adds one, for its node's ``TIME``), never a SCAN, and lists at most ``most``
waiters, parked calls and slot holders (the totals are exact).

This module is the public face of the explanation; each part is read and shown by the
state face of its mode, in the mode's own module (:mod:`.modes.face`, the registry
:data:`.modes.faces.FACES`), and the driver (:mod:`.modes.explanation`) sits below the
conflict policies, so that a policy can attach an explanation to a ``TaskLocked`` or to a
skip record (:func:`conflict_explanation`, which never raises). The ``celery locks
explain`` command and ``task.lock_explain()`` build on it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol, cast

from celery_singleton_lock.modes.burst import Burst
from celery_singleton_lock.modes.explanation import (
    CONFLICT_MOST,
    MOST,
    STATES,
    Explanation,
    conflict_explanation,
    explain_key,
)
from celery_singleton_lock.modes.held import LimitUse
from celery_singleton_lock.modes.holders import Held, Waiter
from celery_singleton_lock.modes.parking import Handed, Parked
from celery_singleton_lock.modes.pending import FollowUp
from celery_singleton_lock.modes.starts import Throttle

if TYPE_CHECKING:
    from celery_singleton_lock.engine.stack import Stack
    from celery_singleton_lock.options import LockOptions

__all__ = [
    "CONFLICT_MOST",
    "MOST",
    "STATES",
    "Burst",
    "Explanation",
    "FollowUp",
    "Handed",
    "Held",
    "LimitUse",
    "Parked",
    "Throttle",
    "Waiter",
    "conflict_explanation",
    "explain_key",
    "weighed_stack",
]


class _Locking(Protocol):
    """What :func:`weighed_stack` needs of a task's locking (``runtime.TaskLocking``)."""

    @property
    def options(self) -> LockOptions: ...

    def stack(self, args: Any, kwargs: Any) -> Stack | None: ...


def weighed_stack(locking: _Locking, args: Any, kwargs: Any) -> tuple[Stack | None, str | None]:
    """The stacked limits of a call to explain, and why its ``lock_weight`` failed (None
    when it did not): a weight callable may raise anything, or give no valid weight, and
    an explanation still shows what it can. The stack is then read at a stand-in weight
    (which :func:`explain_key` leaves out). A failure that is not the weight's (a limit
    template that does not render) raises."""
    try:
        return locking.stack(args, kwargs), None
    except Exception as exc:  # a user's lock_weight callable may raise anything
        if not callable(locking.options.weight):
            raise
        options = dataclasses.replace(locking.options, weight=1)
        stand_in: _Locking = dataclasses.replace(cast("Any", locking), options=options)
        stack = stand_in.stack(args, kwargs)  # raises again when the weight was not at fault
        text = " ".join(str(exc).split())
        why = (
            text
            if isinstance(exc, ValueError) and "lock_weight" in text
            else f"lock_weight raised {type(exc).__name__}: {text}"
        )
        return stack, why

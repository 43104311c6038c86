"""``RedisLock``: the SETNX/GETSET expiry-timestamp lock, made safe.

The key's value says until when the lock is held (Redis server milliseconds), who holds
it (an owner token) and with which fencing token. Acquire is SETNX, else take over an
expired value; release and extend act only for the owner. How each step reaches Redis is
a :class:`~celery_singleton_lock.engine.protocol.Protocol`: Lua scripts by default, the classic
plain commands with ``scripting=False``.

Ownership belongs to one *hold* (one successful acquire), never to the object: each hold
gets an owner token of its own, so a thread that shares an instance with the holder, or a
child process forked while it was held, contends like any other client.

Waiters queue up and block (BLPOP); a release hands the lock straight to the first live
waiter (scripted mode) or wakes one (plain mode), so a hand-off costs no sleep and, with
scripts, no further round trip. The BLPOP timeout doubles as the fallback poll that notices
a crashed holder's lease running out. This module imports nothing from Celery.

This module is the public API and how a thread makes each call; the steps of acquire, wait,
release, extend and every read are written once, as flows, in :class:`~.steps.LockSteps`,
which the asyncio engine (:mod:`~.aio`) runs too. A hold is a :class:`~.holds.Hold`, and the
lease renewal's thread lanes ``RedisLock`` inherits from :class:`~.renewal.Renewing`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from types import TracebackType
from typing import Any, ClassVar

from celery_singleton_lock.engine.flow import run
from celery_singleton_lock.engine.holds import Hold
from celery_singleton_lock.engine.plain import PlainProtocol
from celery_singleton_lock.engine.protocol import Protocol
from celery_singleton_lock.engine.renewal import Renewing
from celery_singleton_lock.engine.scripted import ScriptedProtocol
from celery_singleton_lock.engine.steps import LockSteps
from celery_singleton_lock.engine.value import Holder
from celery_singleton_lock.engine.wire import LockClient
from celery_singleton_lock.exceptions import LockNotOwned

__all__ = ["Holder", "RedisLock"]

log = logging.getLogger("celery_singleton_lock.engine.lock")

#: Every live lock of this process: a forked child resets them (see ``_reset_in_child``).
_instances: weakref.WeakSet[RedisLock] = weakref.WeakSet()


def _reset_in_child() -> None:
    """In a child just forked: every lock starts afresh. A thread of the parent may have been
    inside a lock's method at the fork, holding its mutex or reservation; that thread does
    not exist here, so those locks would never be released and the child's first use of
    the instance would hang. The child holds nothing its parent held anyway."""
    for lock in list(_instances):
        lock._mutex = threading.Lock()
        lock._start_process()


os.register_at_fork(after_in_child=_reset_in_child)


class RedisLock(LockSteps[LockClient], Renewing):
    """A lease-based distributed lock on one Redis key.

    ``timeout`` is the lease in seconds. ``auto_renew`` keeps extending the lease while the
    lock is held (see ``lease_lost``). ``fallback_poll`` bounds how long a waiter sleeps
    without news before it looks again.

    Every hold gets a fresh owner token, so one instance shared by threads, or inherited by
    a forked child, still excludes: the others contend like any client, and the holding
    thread re-acquiring gets ``LockError``. ``release()``, ``extend()``, ``owned()``,
    ``fencing_token`` and ``lease_lost`` act on the calling thread's hold, or, from a
    thread that holds none, on the one hold this instance has in this process (a lock
    taken in one thread and released in another, as ``threading.Lock`` allows) — except
    in a thread whose acquire failed against that very hold: a contender never speaks for
    the holder it lost to.

    ``token`` fixes the owner token instead: every instance and process using that token is
    one owner (threads of one instance still take turns); an instance with a fixed token can
    release or extend that owner's hold without having acquired it. ``claim`` names another
    owner token whose hold this lock's acquire takes over atomically, fencing token
    included (how the run of a queued task takes the lock its message held);
    ``holder_info`` is a short text (or JSON-able mapping) stored with the lock for
    operators.

    ``limit`` > 1 makes it a lock with that many slots (up to ``limit`` holders at once,
    each leased, owner-checked and fenced like a single hold; scripted mode only; at most
    ``MAX_LIMIT``, 100,000: an acquire costs the same whatever the limit); a
    ``group`` (a token prefix) then never holds two slots at once, e.g. the deliveries of
    one task.

    ``replicas`` (default 0) makes every acquire and every lease extension wait until that
    many replicas of the server acknowledge it (Redis ``WAIT``), at most
    ``replicas_timeout`` seconds. When fewer acknowledge in time, an acquire is undone (an
    owner-checked release) and raises ``LockBackendError``; an extension raises
    ``LockBackendError`` without counting as confirmed, so ``lease_lost`` follows by the
    clock if it keeps failing. It narrows the window in which a failover loses a lock that
    was just granted; it does not close it (see docs/deployment.md).

    ``fair_after`` (seconds; default None: first come, first served) relaxes the order of
    waiters for throughput, as Go's ``sync.Mutex`` does: a release frees the lock for
    whoever comes first (a newcomer may take it) while the first waiter has waited less
    than ``fair_after`` since it began, and hands it straight to that waiter after. No
    waiter waits longer than ``fair_after`` plus one holder's critical section past the
    moment it became first. Scripted mode only.

    ``stack`` (an :class:`~.stack.Stack`) makes every hold also take a share of several
    counted limits at once, in the same atomic step or not at all (its weight in each; a
    limit's number may be changed in Redis while holds run). The shares are released,
    renewed and expire with the hold. A try that finds the key free but a limit full fails
    like one that finds the key held (``held_back_by`` names the limit), and a waiter is
    woken when a share of that limit is given back. ``name`` must carry the stack's hash
    tag. Scripted mode only.

    ``unless_finished`` (a task id) makes each try first look for that task id in the key's
    record of finished runs (what a ``release(record=...)`` writes): when it is there the try
    takes nothing and ``found_finished`` is set, in the same step as the try itself. With
    ``scripting=False`` nothing is checked (``checks_finished`` is False).
    """

    #: The protocol for each value of ``scripting``; tests substitute instrumented ones.
    protocols: ClassVar[dict[bool, type[Protocol]]] = {
        True: ScriptedProtocol,
        False: PlainProtocol,
    }
    _kind = "RedisLock"
    _caller = "thread"
    _log = log
    protocol: Protocol

    def _setup(self) -> None:
        self._mutex = threading.Lock()
        _instances.add(self)

    def _start_process(self) -> None:
        self._reservation = threading.Lock()  # threads of one fixed-token owner take turns
        super()._start_process()

    def _wire(self, *args: Any, **kwargs: Any) -> Protocol:
        return self.protocols[self.scripting](self.client, *args, **kwargs)

    def _me(self) -> threading.Thread:
        return threading.current_thread()

    def _holder_alive(self, hold: Hold) -> bool:
        return hold.thread.is_alive()

    def _reserve(self, blocking: bool, deadline: float | None) -> bool:
        """The local turn of a fixed-token owner's threads."""
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        return bool(self._reservation.acquire(blocking, wait if blocking else -1))

    _sleep = staticmethod(time.sleep)

    def _renew(self, hold: Hold) -> float | None:
        """Extend ``hold``'s lease (called by a renewer lane's thread); the delay until its
        next renewal, or None to stop."""
        return run(self, self._renewal(hold))

    # -- public API ---------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; wait up to ``timeout`` seconds (None or ``math.inf``: forever; a
        finite wait is at most ``MAX_DURATION``, 365 days) when ``blocking``.

        Returns False only when the lock stayed held; Redis errors raise LockBackendError.
        The calling thread must not hold this instance already (LockError).
        """
        return run(self, self._acquire(blocking, timeout))

    def release(self, *, record: tuple[str, str, int] | None = None) -> None:
        """Release the lock; LockNotOwned if this instance no longer holds it.

        ``record`` = (done set, task id, keep ms) also records that task id as finished in
        the lock's done set (``keyspace.DONE``, pruned to ``keep ms``) in the same atomic
        step.
        """
        run(self, self._release(record))

    def extend(self, timeout: float | None = None) -> None:
        """Set the lease end to server now + ``timeout`` (default: the lease); owner only."""
        run(self, self._extend(timeout))

    def owned(self) -> bool:
        """Whether this instance holds the lock right now, per the server's clock."""
        return run(self, self._owned())

    def locked(self) -> bool:
        """Whether anyone holds the lock (any of its slots) right now, per the server's
        clock."""
        return bool(self.holders())

    def holder(self) -> Holder | None:
        """Who holds the lock now (token, fencing token, lease left, holder info), or None;
        with several slots, the newest holder (the largest fencing token)."""
        return run(self, self._holder())

    def holders(self) -> list[Holder]:
        """Everyone holding the lock now, one per slot held (at most ``limit``).

        With slots, the slot index names the slots held (slot 1, the lock key, is always
        looked at too) and each is judged by its value: three round trips, whose cost grows
        with the holders, not with ``limit``."""
        return run(self, self._holders())

    def __enter__(self) -> RedisLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc is None:
                raise
            log.warning("lock %r was lost before the block that held it failed", self.name)

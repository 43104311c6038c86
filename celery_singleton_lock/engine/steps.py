"""What ``RedisLock`` and ``AsyncRedisLock`` do, written once: the steps of acquire, wait,
release, extend, renewal and every read, as flows (:mod:`.flow`) that yield the protocol
call to make and are sent its reply. ``RedisLock`` runs them blocking (:func:`.flow.run`),
``AsyncRedisLock`` awaiting each call (:func:`.flow.arun`). Imports nothing from Celery.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from typing import TYPE_CHECKING, ClassVar, cast

from celery_singleton_lock.engine import rules
from celery_singleton_lock.engine.core import Client, LockCore
from celery_singleton_lock.engine.flow import Flow, Op, Shield
from celery_singleton_lock.engine.holds import Hold
from celery_singleton_lock.engine.protocol import Attempt, Grant
from celery_singleton_lock.engine.renewal import MIN_RENEW_RETRY, RENEW_DIVISOR
from celery_singleton_lock.engine.value import Holder, LockValue
from celery_singleton_lock.exceptions import LockBackendError, LockError, LockNotOwned

__all__ = ["LockSteps"]

#: What renewals say about a hold (both engines; the sync engine's logger, as before).
lock_log = logging.getLogger("celery_singleton_lock.engine.lock")


class LockSteps(LockCore[Client]):
    """The steps of a lock, as flows. An engine runs them (``flow.run`` or ``flow.arun``)
    and provides ``_reserve`` and ``_sleep`` (the two waits that are not Redis calls) and
    ``_start_renewal``."""

    #: Whether an interrupt can cut off a reply that granted the lock (asyncio
    #: cancellation is routine): then a waiter that is interrupted also gives back a hold
    #: under its attempt's own token.
    _recovers_cut_replies: ClassVar[bool] = False
    _log: ClassVar[logging.Logger]

    if TYPE_CHECKING:

        def _start_renewal(self, hold: Hold) -> None: ...

    # -- acquire and wait -------------------------------------------------------------------

    def _acquire(self, blocking: bool, timeout: float | None) -> Flow[bool]:
        """``acquire()``: take a turn (a fixed token), try and wait, record the hold."""
        wait = rules.wait_for(timeout)
        me = self._me()
        if me is None:
            raise LockError(f"{self._kind}.acquire() must run in an asyncio task", self.name)
        if self._own_hold(me) is not None:
            raise LockError(
                f"this {self._caller} already holds it ({self._kind} is not re-entrant)",
                self.name,
            )
        deadline = None if wait is None else time.monotonic() + wait
        reserved = False
        if self._fixed_token is not None:
            # One owner token, several callers: the server cannot tell them apart.
            if not (yield Op("_reserve", (blocking, deadline), True)):
                return False
            reserved = True
        try:
            hold = yield from self._take(blocking, deadline)
            if hold is not None and self.replicas:
                yield from self._replicate_or_undo(hold.token, hold.key)
        except BaseException:
            if reserved:
                self._reservation.release()
            raise
        if hold is None:
            if reserved:
                self._reservation.release()
            if self._fixed_token is None:  # a fixed token is one owner, whichever caller
                with self._mutex:
                    if self._contended is None:
                        self._contended = weakref.WeakKeyDictionary()
                    self._contended[me] = tuple(self._holds.values())
            return False
        hold.reserved = reserved
        with self._mutex:
            self._holds[me] = hold
            if self._contended:
                self._contended.pop(me, None)
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    def _take(self, blocking: bool, deadline: float | None) -> Flow[Hold | None]:
        """Try, and while blocking wait and try again, until granted or the wait is over."""
        token = self._fixed_token or self.group + secrets.token_hex(16)
        cap = self._poll_cap()
        poll_ms = max(1, round(cap * 1000))
        queued = False
        self.found_finished = False
        while True:
            started = time.monotonic()
            mode = rules.acquire_mode(queued, blocking)
            try:
                attempt = yield Op("acquire", (token, self._lease_ms, mode, self.claim, poll_ms))
            except LockBackendError as exc:
                number, key = yield from self._held_after_lost_reply(exc, token, queued=blocking)
                attempt = Attempt(True, number, key)
            except BaseException:
                if self._recovers_cut_replies:
                    # Interrupted with the try on its way: the server may have queued us or
                    # granted the lock. Leave nothing held in our name.
                    yield Shield(self._stop_waiting(token))
                raise
            self.held_back_by = attempt.limit
            if attempt.finished:
                self.found_finished = True
                return None
            if attempt.acquired:
                return self._granted(token, Grant(attempt.number, attempt.key), started)
            step = rules.next_step(
                attempt.number,
                blocking=blocking,
                deadline=deadline,
                now=time.monotonic(),
                poll_ms=poll_ms,
                cap=cap,
            )
            if step.next is rules.Next.GIVE_UP:
                return None
            queued = True
            granted: Grant | None = None
            try:
                if step.next is rules.Next.CANCEL:
                    granted = yield Op("cancel", (token,))
                    return None if granted is None else self._granted(token, granted, started)
                # Block until a release hands us the lock or wakes us, the holder's lease
                # ends (its crash is noticed then), or the fallback period passes. A grant
                # comes after the try that queued us: ``started`` bounds its lease below.
                if step.pop is not None:
                    granted = yield Op("wait", (token, step.pop, attempt.limit))
                elif step.sleep > 0:
                    yield Op("_sleep", (step.sleep,), True)  # the last stretch, exactly
            except BaseException:
                if step.next is rules.Next.CANCEL and not self._recovers_cut_replies:
                    raise
                yield Shield(self._stop_waiting(token))
                raise
            if granted is not None:
                return self._granted(token, granted, started)

    def _granted(self, token: str, grant: Grant, started: float) -> Hold:
        lease_end = started + self._lease_ms / 1000
        return Hold(
            token, grant.fence, threading.current_thread(), lease_end, grant.key or self.name
        )

    def _stop_waiting(self, token: str) -> Flow[None]:
        """Leave the queue after an error or interrupt while trying or waiting; a grant that
        arrived meanwhile is given back. Where an interrupt may have cut off the reply that
        carried a grant (or the try that acquired), a lock still held under this attempt's
        own token is given back too (owner-checked; never under a fixed ``token``, which
        other holders share)."""
        try:
            granted = yield Op("cancel", (token,))
            if granted is not None:
                yield Op("release", (token, None, granted.key))
            elif self._recovers_cut_replies and self._fixed_token is None:
                key = self.name if self.limit == 1 else (yield from self._slot_of(token))
                if key is not None:
                    yield Op("release", (token, None, key))
        except LockError as exc:
            self._log.warning("lock %r: could not leave the waiters' queue: %s", self.name, exc)

    def _held_after_lost_reply(
        self, error: LockBackendError, token: str, *, queued: bool
    ) -> Flow[tuple[int, str | None]]:
        """After an acquire whose reply was lost (a connection error mid-call), look once,
        by token, whether the write happened: return the hold's fencing token if it did,
        so the caller owns what the server granted; re-raise ``error`` if it did not (or
        the server cannot say), leaving nothing held in our name that we do not know of
        but for a lease the server will end."""
        if not rules.reply_lost(error):
            raise error
        try:
            key = yield from self._slot_of(token)
            now_ms, value, _ = yield from self._inspect(key)
        except LockBackendError:
            raise error from error.__cause__
        if value is None or not rules.owns(value, token, now_ms):
            granted = None
            if queued:  # leave the queue if that try put us there
                try:
                    granted = yield Op("cancel", (token,))
                except LockError:
                    granted = None
            if granted is None:
                raise error
            return granted.fence, granted.key
        self._log.warning("lock %r: acquire reply lost, but the server granted it", self.name)
        return value.fence or 0, key

    # -- release, extend, renew -------------------------------------------------------------

    def _release(self, record: tuple[str, str, int] | None) -> Flow[None]:
        """``release()``: owner-checked, of the caller's hold or the fixed token's."""
        hold = self._hold()
        key = None
        if hold is not None:
            # The next caller of a fixed-token owner waits until the server has released:
            # it presents the same token, so a release still in flight would delete its hold.
            self._end(hold, keep_turn=True)
            token, key = hold.token, hold.key
        elif self._fixed_token is not None:
            token = self._fixed_token  # this instance speaks for that owner
            key = yield from self._slot_of(token)
        else:
            raise LockNotOwned("cannot release a lock this instance does not hold", self.name)
        try:
            released = yield Op("release", (token, record, key))
        finally:
            if hold is not None:
                self._end_turn(hold)
        if not released:
            raise LockNotOwned("cannot release a lock that is no longer owned", self.name)

    def _extend(self, timeout: float | None) -> Flow[None]:
        """``extend()``: server now + ``timeout`` (default: the lease), owner only."""
        lease = self._lease_ms if timeout is None else rules.lease_ms(timeout, "timeout")
        hold = self._hold()
        if hold is None and self._fixed_token is None:
            raise LockNotOwned("cannot extend a lock this instance does not hold", self.name)
        started = time.monotonic()
        key: str | None
        if hold is not None:
            token, key = hold.token, hold.key
        else:
            token = cast("str", self._fixed_token)
            key = yield from self._slot_of(token)
        if not (yield Op("extend", (token, lease, key))):
            raise LockNotOwned("cannot extend a lock that is no longer owned", self.name)
        if self.replicas:
            yield from self._replicate()
        if hold is not None and not hold.ended:
            hold.expires_at = started + lease / 1000
        self._renewed()

    def _renewed(self) -> None:
        """Called after every confirmed extension of the lease, by ``extend()`` or by a
        renewal; a hook for subclasses that observe renewals."""

    def _renewal(self, hold: Hold) -> Flow[float | None]:
        """One renewal of ``hold``: the delay until the next one, or None to stop."""
        if hold.ended or not self.auto_renew:
            return None
        started = time.monotonic()
        try:
            expiry = yield Shield(self._extended(hold))
            if expiry and self.replicas:
                yield from self._replicate()
        except Exception as exc:  # noqa: BLE001 - a LockError, or a client closed under us
            return self._renewal_reply(hold, started, exc)
        return self._renewal_reply(hold, started, expiry)

    def _extended(self, hold: Hold) -> Flow[int]:
        # Shielded: ending a hold stops its renewal, never a call half sent on a connection.
        expiry: int = yield Op("extend", (hold.token, self._lease_ms, hold.key))
        return expiry

    def _renewal_reply(
        self, hold: Hold, started: float, reply: int | BaseException
    ) -> float | None:
        """Record what a renewal sent at ``started`` brought (the new expiry, 0 when the
        hold is no longer ours, or an error); the delay until the next one, or None."""
        if hold.ended:
            return None  # a reply about a hold that ended meanwhile: nothing to record
        if isinstance(reply, BaseException):
            left = hold.expires_at - time.monotonic()
            if left <= 0:
                hold.lost = True
                lock_log.error("lock %r: lease lost, Redis unreachable: %s", self.name, reply)
                return None
            lock_log.warning("lock %r: renewal failed, retrying: %s", self.name, reply)
            return min(max(left / 4, MIN_RENEW_RETRY), self.timeout / RENEW_DIVISOR)
        if not reply:
            hold.lost = True
            lock_log.error("lock %r: lease lost (another holder took it or it expired)", self.name)
            return None
        hold.expires_at = started + self._lease_ms / 1000
        self._renewed()
        return self.timeout / RENEW_DIVISOR

    def _replicate(self) -> Flow[None]:
        """Wait until ``replicas`` replicas acknowledge every write the server made so far;
        LockBackendError when fewer do within ``replicas_timeout``."""
        acked = yield Op("replicate", (self.replicas, self._replicas_timeout_ms))
        if acked < self.replicas:
            raise LockBackendError(
                f"only {acked} of {self.replicas} replicas acknowledged the lock within "
                f"{self.replicas_timeout:g} s",
                self.name,
            )

    def _replicate_or_undo(self, token: str, key: str) -> Flow[None]:
        """After a hold was granted to ``token``: wait for the replicas, or give the hold
        back (owner-checked) and re-raise, so no lock stays granted that a failover could
        lose."""
        try:
            yield from self._replicate()
        except LockBackendError:
            try:
                yield Op("release", (token, None, key))
            except LockError as exc:  # the server will end the lease
                self._log.warning(
                    "lock %r: could not undo an unreplicated acquire: %s", self.name, exc
                )
            raise

    # -- reading the server -----------------------------------------------------------------

    def _owned(self) -> Flow[bool]:
        """``owned()``: whether the caller's hold is the lock's, per the server's clock."""
        token = self.token
        if token is None:
            return False
        hold = self._hold()
        key = hold.key if hold is not None else (yield from self._slot_of(token))
        now_ms, value, _ = yield from self._inspect(key)
        return rules.owns(value, token, now_ms)

    def _holder(self) -> Flow[Holder | None]:
        """``holder()``: who holds the lock now; with slots, the newest holder."""
        if self.limit == 1:
            return rules.holder_at(*(yield from self._inspect()))
        return rules.newest((yield from self._holders()))

    def _holders(self) -> Flow[list[Holder]]:
        """``holders()``: one per slot held (at most ``limit``)."""
        if self.limit == 1:
            holder = yield from self._holder()
            return [holder] if holder is not None else []
        return rules.holders_at(*(yield from self._held_slots()))

    def _inspect(self, key: str | None = None) -> Flow[tuple[int, LockValue | None, int | None]]:
        """Server time, the parsed value of ``key`` (default: the lock key) and its PTTL."""
        now_ms, raw, ttl = yield Op("inspect", (key or self.name,))
        return now_ms, rules.value_of(raw), int(ttl)

    def _held_slots(self) -> Flow[tuple[int, list[tuple[str, LockValue | None, int]]]]:
        """Server now (ms), and the key, parsed value and PTTL of slot 1 and of every slot
        the slot index says is held at that moment (``engine/scripts/lib/slots.lua``)."""
        now_ms = (yield Op("server_time"))[0]
        members = yield Op("slot_index", (now_ms,))
        keys = [self.slot_key(number) for number in rules.slot_numbers(members, self.limit)]
        replies = yield Op("read_slots", (keys,))
        return now_ms, [
            (key, rules.value_of(replies[2 * i]), int(replies[2 * i + 1]))
            for i, key in enumerate(keys)
        ]

    def _slot_of(self, token: str) -> Flow[str | None]:
        """The slot held under ``token`` (a fixed-token instance acting for an owner): the
        one the slot index's owners name, checked against its value; else (an index lost
        or wrong) the one among the slots held whose value has that token. None without
        slots."""
        if self.limit == 1:
            return None
        raw = yield Op("owner_slot", (token,))
        number = rules.slot_number(raw) if raw is not None else None
        if number is not None:
            key = self.slot_key(number)
            value = rules.value_of((yield Op("get", (key,))))
            if value is not None and value.token == token:
                return key
        return rules.slot_held_by((yield from self._held_slots())[1], token)

"""``lock_on_conflict="coalesce"`` and ``"replace"``: one pending follow-up per queued key.

A follow-up is the one call that runs after the current holder of a key. It is a hash beside
the lock (``keyspace.PENDING``): its task id, the owner token and holder info its queue lock
will carry, and the call itself (serialized arguments, publish options). The first call made
while the key is held creates it under its own task id; later calls replace its arguments
and options but keep that task id, so every one of them gets the same ``AsyncResult``. When
the holder's run ends (or is lost), one engine script checks that the holder still owns the
lock, writes the lock for the follow-up's queue token (a new fencing token, the queue
lease), deletes the hash and hands the call back; the releasing process publishes it under
that task id, past the lock. Nobody else can consume the hash, so it is published once.

``replace`` goes further while the holder is still *queued* (its message not yet running):
the new call takes the lock over at once (a new fencing token), the superseded task id is
marked in Redis and stored as REVOKED in the result backend, and when its message is
delivered it ends without running (``Ignore``: nothing overwrites the REVOKED state). A
running holder is left to finish and the new call becomes its follow-up, unless
``lock_replace_running`` asks to revoke it (terminate) and take the lock over at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from celery import states
from celery.exceptions import Ignore
from kombu.serialization import dumps, loads

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.exceptions import LockBackendError, TaskLocked
from celery_singleton_lock.modes.base import ConflictPolicy, HandedCall, Swept
from celery_singleton_lock.modes.parking import index_key
from celery_singleton_lock.modes.policies import UNCOUNTED_RETRY, refuse_in_canvas, tell
from celery_singleton_lock.options import Combination, no_scripts

if TYPE_CHECKING:
    from celery_singleton_lock.engine import Holder, RedisLock
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import AnyResult, Publish, Release, Run
    from celery_singleton_lock.options import LockOptions

__all__ = ["Coalesce", "Replace"]

log = logging.getLogger("celery_singleton_lock.task")

#: The publish options a follow-up keeps (routing); a countdown or eta of the call that
#: created it is not kept: a follow-up runs when its holder ends.
KEPT_OPTIONS = ("queue", "routing_key", "exchange", "priority", "headers", "serializer")
#: How often a call tries again when the key changes hands under it.
FOLLOW_TRIES = 8
#: A pending follow-up is kept at least this long (seconds), or the queue lease if longer.
MIN_KEEP = 86_400
#: How long (seconds) the end of a run tries again to hand its key over while Redis errs.
HAND_OVER_PATIENCE = 30.0


def _pending(call: Publish, task_id: str) -> atomic.Pending:
    """This call as the follow-up it would become."""
    lock = call.queue_lock(task_id)
    options = call.publish_options
    content_type, encoding, body = dumps(
        [list(call.args), dict(call.kwargs)], serializer=call.serializer
    )
    kept = {name: options[name] for name in KEPT_OPTIONS if options.get(name) is not None}
    keep_ms = max(1, int(max(call.options.queue_timeout, MIN_KEEP) * 1000))
    data = body if isinstance(body, bytes) else str(body).encode()
    return atomic.Pending(
        task_id,
        lock.token or "",
        lock.holder_info,
        data,
        content_type,
        encoding,
        json.dumps(kept, default=str),
        keep_ms,
    )


def _lease_ms(ending: Release) -> int:
    """The queue lease a follow-up is handed the key for (ms)."""
    return max(1, int(ending.options.queue_timeout * 1000))


def handed_call(handed: atomic.Handed) -> HandedCall:
    """The call of a follow-up handed the key, decoded for publishing."""
    args, kwargs = loads(
        handed.body, handed.content_type, handed.encoding, accept={handed.content_type}
    )
    return HandedCall(handed.task_id, tuple(args), dict(kwargs), json.loads(handed.options))


def stops_running_tasks(pool: type) -> bool:
    """Whether ``revoke(terminate=True)`` stops a running task on a worker of this pool
    class: prefork terminates the child, eventlet and gevent kill the green thread; solo
    and threads cannot (their ``terminate_job`` is the base class's, which refuses)."""
    from celery.concurrency.base import BasePool  # noqa: PLC0415 - Celery's pool machinery
    from celery.concurrency.prefork import TaskPool as Prefork  # noqa: PLC0415

    if issubclass(pool, Prefork):
        return True
    return getattr(pool, "terminate_job", None) is not BasePool.terminate_job


class Coalesce(ConflictPolicy):
    """Calls made while the key is held collapse into one follow-up with the latest
    arguments, run once the holder ends."""

    name = reported = "coalesce"
    keeps_calls = True  # the pending follow-up lives only in the lock Redis
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: o.on_conflict in ("coalesce", "replace") and o.scope != "queue",
            "lock_on_conflict='coalesce' or 'replace' needs lock_scope='queue' (they keep one "
            "follow-up per queued key)",
        ),
        Combination(
            lambda o, _: o.on_conflict in ("coalesce", "replace") and o.limit != 1,
            "lock_on_conflict='coalesce' or 'replace' needs lock_limit=1 (one holder, one "
            "follow-up)",
        ),
        Combination(
            lambda o, _: o.on_conflict in ("coalesce", "replace") and o.release != "end",
            "lock_on_conflict='coalesce' or 'replace' needs lock_release='end' (the follow-up "
            "takes the key when its holder's run ends)",
        ),
        Combination(
            lambda o, s: o.on_conflict in ("coalesce", "replace") and no_scripts(s),
            "lock_on_conflict='coalesce' or 'replace' needs Lua scripts (the follow-up is kept "
            "and handed over by scripts), which singleton_lock_scripting=False turns off",
        ),
        Combination(
            lambda o, _: o.debounce is not None and o.on_conflict in ("coalesce", "replace"),
            "lock_debounce cannot be combined with lock_on_conflict='coalesce' or 'replace' (a "
            "burst already keeps one call)",
        ),
    )

    @classmethod
    def applies(cls, options: LockOptions) -> bool:
        return options.on_conflict == cls.name

    # -- a run whose queued lock was lost meanwhile comes back ---------------------------

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        tell(run, "retry", holder)
        exc = TaskLocked(run.key, holder.task_id if holder else None)
        raise run.retry(exc, run.countdown(holder))

    def throttled(self, run: Run, retry_in: float) -> bool:
        """A follow-up (or any call of the key) is the work: it comes back when the window
        frees, as under ``retry``, instead of failing."""
        return UNCOUNTED_RETRY.throttled(run, retry_in)

    # -- the end of the holder's run hands the key to the follow-up ------------------------

    def release(self, ending: Release, state: str | None) -> bool:
        """Hand the key to the pending follow-up, or release it, in one atomic step. An
        error (Redis stalled or restarting) is tried again for ``HAND_OVER_PATIENCE``
        seconds — in the run's own thread, or in a thread of its own in the worker's main
        process (a lost run's release must not hold up the consumer) — rather than fall
        back to a plain release, which would leave the follow-up behind. Past that the hold
        is left to its lease, and the worker sweep hands the follow-up the free key."""
        if state == states.RETRY:
            return False  # a retried run keeps the key for its retry (or frees it)
        try:
            outcome = atomic.hand_over(ending.lock, _lease_ms(ending), ending.record)
        except LockBackendError as exc:
            if not ending.blocking:
                threading.Thread(
                    target=self._hand_over_again,
                    args=(ending, state, exc),
                    name=f"csl-hand-over-{ending.task_id}",
                    daemon=True,
                ).start()
                return True
            self._hand_over_again(ending, state, exc)
            return True
        self._ended(ending, state, outcome)
        return True

    def _hand_over_again(self, ending: Release, state: str | None, error: Exception) -> None:
        """Try the hand-over again until it answers or ``HAND_OVER_PATIENCE`` runs out (a
        try whose reply was lost is recognised by the script: it gets its call back)."""
        lock = ending.lock
        deadline = time.monotonic() + HAND_OVER_PATIENCE
        pause = 0.1
        while time.monotonic() + pause <= deadline:
            log.warning("could not hand %s over yet, trying again: %s", lock.name, error)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            try:
                outcome = atomic.hand_over(lock, _lease_ms(ending), ending.record)
            except LockBackendError as exc:
                error = exc
                continue
            try:
                self._ended(ending, state, outcome)
            except Exception:  # publishing failed (the broker): logged, as on the first try
                log.exception("could not publish the follow-up of %s", lock.name)
            return
        log.error(
            "could not hand %s over to its follow-up: %s; the worker sweep hands a follow-up "
            "the key once this hold's lease runs out",
            lock.name,
            error,
        )
        lock.detach()

    def _ended(self, ending: Release, state: str | None, outcome: atomic.Handed | int) -> None:
        """The hand-over answered: report the end of the hold and publish the follow-up."""
        ending.lock.detach()
        handed = isinstance(outcome, atomic.Handed) and not outcome.adopted
        ending.released(state, held=handed or (isinstance(outcome, int) and outcome > 0))
        if isinstance(outcome, atomic.Handed):
            log.info(
                "%s[%s]: lock %s handed to its follow-up %s",
                ending.task.name,
                ending.task_id,
                ending.lock.name,
                outcome.task_id,
            )
            ending.publish_past_lock(handed_call(outcome))

    def sweep(self, client: LockClient, key: str, options: LockOptions) -> Swept:
        """A follow-up left behind beside a free key gets the key (see :meth:`release`)."""
        waiting, handed = atomic.adopt(client, key, max(1, int(options.queue_timeout * 1000)))
        if handed is None:
            return Swept(waiting, ())
        log.warning(
            "follow-up %s of %s was left behind; the sweep hands it the key", handed.task_id, key
        )
        return Swept(False, (handed_call(handed),))

    # -- a call while the key is held -------------------------------------------------------

    def publish_conflict(self, call: Publish, lock: RedisLock) -> AnyResult:
        key = lock.name
        refuse_in_canvas(call, key, None, f"its key is held ({self.name} would not publish it)")
        index_key(call.client, call.prefix, key, call.task.name)  # the sweep's list
        for _ in range(FOLLOW_TRIES):
            found = self._follow(call, key)
            if found.outcome == "revoke":
                self._revoke_running(call, key, str(found.holder), str(found.task_id))
            if found.outcome in ("follow", "revoke"):
                observe.conflict(call.task, key, None, policy=self.name, scope="queue")
                observe.coalesced(call.task, key, str(found.task_id), scope="queue")
                log.info(
                    "%s[%s] not published: it is the follow-up %s of %s",
                    call.task.name,
                    call.task_id,
                    found.task_id,
                    key,
                )
                return call.result(str(found.task_id))
            if found.outcome == "superseded":
                return self._superseded(call, key, str(found.task_id))
            chosen = str(found.task_id) if found.outcome == "adopt" else call.task_id
            queued = call.queue_lock(chosen)
            if queued.acquire(blocking=False):
                return call.send_locked(queued, chosen)
        raise TaskLocked(key, None, f"lock {key!r} kept changing hands; {self.name} gave up")

    def _follow(self, call: Publish, key: str) -> atomic.Followed:
        return atomic.follow(call.client, key, _pending(call, call.task_id))

    def _superseded(self, call: Publish, key: str, old: str) -> AnyResult:
        raise AssertionError("coalesce never supersedes")  # pragma: no cover

    def _revoke_running(self, call: Publish, key: str, old: str, follow_up: str) -> None:
        raise AssertionError("coalesce never revokes")  # pragma: no cover


def _store_revoked(task: Any, task_id: str, by: str) -> None:
    """Store REVOKED for ``task_id``, superseded by call ``by``."""
    try:
        task.backend.mark_as_revoked(task_id, reason=f"superseded by {by}")
    except Exception:  # a disabled or unreachable result backend: the log says it
        log.warning("could not store REVOKED for superseded task %s", task_id, exc_info=True)


class Replace(Coalesce):
    """A new call supersedes a queued holder (and, with ``lock_replace_running``, a running
    one); a running holder otherwise gets the call as its follow-up."""

    name = reported = "replace"
    rules: ClassVar[tuple[Combination, ...]] = (
        Combination(
            lambda o, _: o.replace_running and o.on_conflict != "replace",
            "lock_replace_running is only meaningful with lock_on_conflict='replace'",
        ),
    )

    def worker_problem(self, options: LockOptions, pool: type | None) -> str | None:
        """``lock_replace_running`` revokes the running holder with ``terminate=True``; a pool
        that cannot terminate a running task (solo, threads) would let the old run go on
        beside the new one."""
        if not options.replace_running or pool is None or stops_running_tasks(pool):
            return None
        return (
            f"lock_replace_running needs a pool that can stop a running task (prefork, "
            f"eventlet, gevent); this worker's pool {pool.__module__}.{pool.__qualname__} "
            "cannot, so a replaced run would overlap the new one"
        )

    def deliver(self, run: Run) -> None:
        """A superseded call never runs, whenever its message comes (a countdown, a busy
        worker's prefetch, another queue), and ends REVOKED: stored again here, since a
        call superseded while it retried may have had its REVOKED overwritten by the RETRY
        that Celery stores after publishing the retry."""
        by = atomic.superseded_by(run.client, run.key, run.task_id)
        if by is not None:
            _store_revoked(run.task, run.task_id, by)
            observe.superseded(run.task, run.key, run.task_id, by=by, running=False)
            log.info("%s[%s] not run: superseded by %s", run.task.name, run.task_id, by)
            raise Ignore

    def conflict(self, run: Run, holder: Holder | None) -> Any:
        """A run that finds its key taken may have been superseded after its delivery was
        checked (the marker is written in the step that took the key): it ends without
        running, as at delivery, rather than retry and overwrite its REVOKED state."""
        self.deliver(run)
        return super().conflict(run, holder)

    def _follow(self, call: Publish, key: str) -> atomic.Followed:
        lease_ms = max(1, int(call.options.queue_timeout * 1000))
        return atomic.replace(
            call.client,
            key,
            _pending(call, call.task_id),
            running=call.options.replace_running,
            lease_ms=lease_ms,
        )

    def _superseded(self, call: Publish, key: str, old: str) -> AnyResult:
        """A queued holder was superseded: the script took the key for this call."""
        task, task_id = call.task, call.task_id
        _store_revoked(task, old, task_id)
        observe.conflict(task, key, None, policy="replace", scope="queue", holder_task_id=old)
        observe.superseded(task, key, old, by=task_id, running=False)
        log.info("%s[%s] supersedes %s (%s)", task.name, task_id, old, key)
        return call.send_locked(call.queue_lock(task_id), task_id)

    def _revoke_running(self, call: Publish, key: str, old: str, follow_up: str) -> None:
        """``lock_replace_running``: the running holder is revoked (terminate) and the call
        became its follow-up, which gets the key once that run has really stopped (its
        worker's parent frees it when the process is gone), so the two never overlap."""
        task = call.task
        task.app.control.revoke(old, terminate=True)
        observe.superseded(task, key, old, by=follow_up, running=True)
        log.info(
            "%s[%s] revokes the running %s (%s); it runs as the follow-up %s once that "
            "run has stopped",
            task.name,
            call.task_id,
            old,
            key,
            follow_up,
        )

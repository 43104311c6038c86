"""The objects the pipelines pass around: a :class:`Run` is one delivery of a locked task's
message, a :class:`Publish` is one ``apply_async`` of it. Both carry the task, the
resolved locking and the key, so no function takes them as loose parameters; they satisfy
the protocols of :mod:`celery_singleton_lock.modes.base`, which is all a mode sees."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from celery.exceptions import Reject, Retry

from celery_singleton_lock import _observe as observe
from celery_singleton_lock._observe import RunLock
from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned
from celery_singleton_lock.modes.parking import HEADER_TURN
from celery_singleton_lock.modes.policies import countdown, jitter
from celery_singleton_lock.modes.scope import queue_token
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.locking import TaskLocking

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    from celery_singleton_lock.engine import Holder
    from celery_singleton_lock.engine.atomic import Record
    from celery_singleton_lock.engine.wire import LockClient
    from celery_singleton_lock.modes.base import ConflictPolicy, HandedCall, Scope
    from celery_singleton_lock.options import LockOptions, Settings

    AnyTask = Task[Any, Any]
    AnyResult = AsyncResult[Any]
else:
    AnyTask = Any
    AnyResult = Any

__all__ = ["CURRENT", "RUN_ATTR", "Publish", "Run", "current_lock", "holding", "publish_past_lock"]

log = logging.getLogger("celery_singleton_lock.task")

#: Attribute of a run's request (Celery's ``Context``) that holds its :class:`Run`.
RUN_ATTR = "singleton_lock"
#: Retries after a Redis outage wait at most this long (seconds) before trying again.
OUTAGE_COUNTDOWN = 5.0

#: The lock held by the task running in this thread or context (``current_lock()``).
CURRENT: ContextVar[RedisLock | None] = ContextVar("singleton_lock_current", default=None)


def current_lock() -> RedisLock | None:
    """The lock held by the task running in this thread or context, or None."""
    return CURRENT.get()


@contextlib.contextmanager
def holding(lock: RedisLock) -> Any:
    """``current_lock()`` is ``lock`` inside the block."""
    token = CURRENT.set(lock)
    try:
        yield
    finally:
        CURRENT.reset(token)


@dataclass(eq=False)
class Run:
    """One delivery of a locked task's message, from its first try of the lock to its end."""

    task: AnyTask
    request: Any
    locking: TaskLocking
    key: str
    lock: RunLock
    body: Callable[[], Any]
    started: float = field(default_factory=time.monotonic)
    #: The run holds its key while the body runs (False before, and when freed at start).
    holding: bool = False
    #: What the release writes in the same step; set as the run ends.
    record: Record | None = None
    #: A mode said this delivery is the work itself (see ``insist``).
    insisting: bool = False

    @functools.cached_property
    def task_id(self) -> str:
        return str(self.request.id)

    @property
    def options(self) -> LockOptions:
        return self.locking.options

    @property
    def settings(self) -> Settings:
        return self.locking.settings

    @property
    def blocking(self) -> bool:
        return True  # the run's own thread may wait for Redis at its end

    @property
    def client(self) -> LockClient:
        return self.lock.client

    @property
    def scope(self) -> Scope:
        return self.locking.plan.scope

    @property
    def policy(self) -> ConflictPolicy:
        return self.locking.plan.policy.for_attempt(bool(self.retries) or self.insisting)

    @property
    def retries(self) -> int:
        """How many times this work came back: the task's own retries and the lock's."""
        return int(self.request.retries or 0) + int(self.header(hdr.HEADER_LOCK_RETRIES) or 0)

    @property
    def eager(self) -> bool:
        return bool(self.request.is_eager)

    def header(self, name: str) -> Any:
        return hdr.header(self.request, name)

    def insist(self) -> None:
        self.insisting = True

    def countdown(self, holder: Holder | None) -> float:
        wait = countdown(self.options, holder, self.retries)
        for mode in self.locking.plan.busy_countdown:
            wait = mode.busy_countdown(self, wait)
        return wait

    def retry(
        self,
        exc: BaseException,
        countdown: float,
        *,
        counted: bool = True,
        duplicate: bool = False,
    ) -> BaseException:
        """The retry a lock that was busy or unreachable asks for: the retried message
        carries this run's key and options and is published past the queue lock (which may
        be held by someone else, or unreachable), so it can neither be dropped nor stay in
        RETRY. A counted retry is the task's own ``task.retry``; any other is published
        here, leaving ``request.retries``, ``max_retries`` and the task object as they are
        (it is counted in a header of its own). An eager run cannot come back later: it
        gets ``exc`` to raise instead."""
        request = self.request
        lock_retries = int(self.header(hdr.HEADER_LOCK_RETRIES) or 0) + (0 if counted else 1)
        headers: dict[str, Any] = {hdr.HEADER_KEY: self.key}
        if lock_retries:
            headers[hdr.HEADER_LOCK_RETRIES] = lock_retries
        if duplicate:
            headers[hdr.HEADER_DUPLICATE] = True
        carried = self.header(hdr.HEADER_OPTIONS)
        if carried:
            headers[hdr.HEADER_OPTIONS] = carried
        if counted:
            retry: Callable[..., BaseException] = self.task.retry
            return retry(exc=exc, countdown=countdown, **{hdr.REPUBLISH_OPTION: headers})
        if self.eager:
            return exc
        options: dict[str, Any] = {hdr.REPUBLISH_OPTION: headers}
        from_request: Callable[..., Any] = self.task.signature_from_request
        sig = from_request(
            request, countdown=countdown, retries=int(request.retries or 0), **options
        )
        try:
            sig.apply_async()
        except Exception as error:  # noqa: BLE001 - as Celery's retry: rejected, not lost silently
            return Reject(error, requeue=False)
        return Retry(exc=cast("Exception", exc), when=cast("Any", countdown), sig=sig)

    def carried_headers(self) -> dict[str, Any]:
        """The headers a message published again for this call (by the lock, not as the
        task's own retry) carries: the lock's retries, one more (it is the work itself
        then), its per-call options and its turn in its key's line."""
        headers: dict[str, Any] = {
            hdr.HEADER_LOCK_RETRIES: int(self.header(hdr.HEADER_LOCK_RETRIES) or 0) + 1
        }
        for name in (hdr.HEADER_OPTIONS, HEADER_TURN):
            value = self.header(name)
            if value is not None:
                headers[name] = value
        return headers

    def outage(self, exc: BaseException, *, going_on: str = "running UNLOCKED") -> None:
        name, task_id = self.task.name, self.task_id
        if self.settings.fail_open:
            log.warning(
                "singleton lock unavailable for %s[%s] (%s): %s because "
                "singleton_lock_fail_open is set",
                name,
                task_id,
                exc,
                going_on,
            )
            return
        if self.lock.fencing_token is not None:
            self.give_back()
        if self.eager:
            # An eager run cannot come back later (Celery would re-run it at once, again and
            # again): the outage is its error.
            raise exc
        log.error("singleton lock unavailable for %s[%s]: %s; retrying", name, task_id, exc)
        countdown = jitter(min(OUTAGE_COUNTDOWN, self.options.timeout))
        # Fail closed without losing the message: retry until the lock Redis answers,
        # whatever the task's max_retries (an outage is not the task's failure).
        raise self.retry(exc, countdown, counted=False) from exc

    def give_back(self) -> None:
        try:
            self.lock.release()
        except LockNotOwned:
            log.warning("lock %s was lost before the run gave it back", self.key)
        except LockBackendError as exc:
            log.error("could not give back lock %s: %s", self.key, exc)

    def queued_lock(self) -> RedisLock:
        return self.locking.new_lock(
            self.task.app, self.key, self.task_id, queued=True, claim=self.lock.token
        )

    @property
    def serializer(self) -> str:
        return self.locking.serializer

    def publish_past_lock(self, call: HandedCall) -> None:
        publish_past_lock(self.task, self.locking, self.key, call)

    def released(self, state: str | None, *, held: bool, hold: float = 0.0) -> None:
        if held:
            observe.released(self.task, self.lock, self.task_id, self.options, state, hold=hold)
            return
        log.warning(
            "lock %s of task %s had expired before the run ended (%s)",
            self.key,
            self.task_id,
            state,
        )
        observe.lost(self.task, self.lock, self.task_id, self.options)


def publish_past_lock(task: AnyTask, locking: TaskLocking, key: str, call: HandedCall) -> None:
    """Publish a call of ``task`` that was just handed ``key`` (a follow-up, a parked call)
    under its own task id, past the lock; if that fails, free the key (the call is lost,
    and logged)."""
    options = {**call.options, hdr.REPUBLISH_OPTION: {hdr.HEADER_KEY: key}}
    try:
        task.apply_async(call.args, call.kwargs, task_id=call.task_id, **options)
    except Exception:
        log.exception("could not publish %s, handed %s; freeing the key", call.task_id, key)
        owner = locking.owner(task.app, key, queue_token(call.task_id, locking.options.limit))
        with contextlib.suppress(LockNotOwned):
            owner.release()
        return
    log.info("%s[%s]: published, handed %s", task.name, call.task_id, key)


@dataclass(eq=False)
class Publish:
    """One ``apply_async`` of a locked task. ``publish_options`` go to Celery's
    ``apply_async``; the queue-lock phase takes ``task_id`` out of them."""

    task: AnyTask
    send_func: Callable[..., AnyResult]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    publish_options: dict[str, Any]
    locking: TaskLocking
    task_id: str = ""
    _key: str | None = None

    @property
    def options(self) -> LockOptions:
        return self.locking.options

    @property
    def client(self) -> LockClient:
        return self.locking.client(self.task.app)

    @property
    def serializer(self) -> str:
        return str(self.publish_options.get("serializer") or self.locking.serializer)

    def key(self) -> str:
        if self._key is None:
            self._key = self.locking.key(
                self.args, self.kwargs, serializer=self.publish_options.get("serializer")
            )
        return self._key

    def send(self, *, task_id: str | None = None, keyed: bool = False, **extra: Any) -> AnyResult:
        options = dict(self.publish_options)
        headers = {**(options.pop("headers", None) or {}), **(extra.pop("headers", None) or {})}
        if keyed:
            headers[hdr.HEADER_KEY] = self.key()
        if headers:
            options["headers"] = headers
        if task_id is not None:
            options["task_id"] = task_id
        options.update(extra)
        return self.send_func(self.args, self.kwargs, **options)

    def send_locked(self, lock: RedisLock, task_id: str) -> AnyResult:
        try:
            return self.send(task_id=task_id, keyed=True)
        except BaseException:
            try:
                lock.release()
            except Exception:  # the publish error is the one to report
                log.exception("could not release %s after a failed publish", lock.name)
            raise

    def queue_lock(self, task_id: str, claim: str | None = None) -> RedisLock:
        return self.locking.new_lock(self.task.app, self.key(), task_id, queued=True, claim=claim)

    def result(self, task_id: str) -> AnyResult:
        return self.task.AsyncResult(task_id)

    @property
    def prefix(self) -> str:
        return self.locking.settings.prefix

    def publish_past_lock(self, call: HandedCall) -> None:
        publish_past_lock(self.task, self.locking, self.key(), call)

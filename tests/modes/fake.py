"""A fake run and a fake publish: each mode's hooks driven by the real pipelines, on a real
lock in a private redis-server, without a broker or a worker.

:class:`FakeRun` is the runtime's own ``Run`` with its two broker-bound steps recorded
instead of published: ``retry`` (a retry the lock asks for) and ``publish_past_lock`` (a
call handed the key). :class:`FakePublish` is the runtime's ``Publish`` whose ``send``
and ``publish_past_lock`` are recorded the same way. Everything else is the package's own
code: the lock (``TaskLocking.new_lock``, Lua scripts on the real server), the plan and
every hook, and the phases of :func:`~celery_singleton_lock.runtime.run.before_body`,
:func:`~celery_singleton_lock.runtime.run.body`,
:func:`~celery_singleton_lock.runtime.finish.finish` and the queue-lock step of
:mod:`celery_singleton_lock.runtime.publish`.

A :class:`Fake` is one Celery app (its tasks give the options; the broker URL is never
used; results go to an in-process cache backend) whose lock Redis is the test's private
server under a prefix of its own. ``fake.deliver(task, ...)`` runs one delivery of a
message the way a worker's tracer would (request pushed, body, result stored);
``fake.publish(task, ...)`` is one ``apply_async``. A recorded :class:`Message` (a publish,
a retry, a handed call) is delivered with ``fake.deliver_message(task, message)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery, states
from celery.app.task import Context
from celery.exceptions import Retry
from celery.result import AsyncResult

from celery_singleton_lock import LockedTask
from celery_singleton_lock.client import LockClient, redis_for
from celery_singleton_lock.engine import Holder, RedisLock
from celery_singleton_lock.modes.base import HandedCall
from celery_singleton_lock.runtime import headers as hdr
from celery_singleton_lock.runtime.context import Publish, Run
from celery_singleton_lock.runtime.finish import release_after_run
from celery_singleton_lock.runtime.locking import locking_for
from celery_singleton_lock.runtime.publish import _queue_lock, _with_call_options
from celery_singleton_lock.runtime.run import before_body, resolve

__all__ = [
    "Delivery",
    "Ended",
    "Fake",
    "FakePublish",
    "FakeRun",
    "Message",
    "Published",
    "Retried",
    "fake_for",
]

_names = itertools.count(1)


@dataclass(frozen=True)
class Message:
    """A message the lock layer would have published: its task id, arguments, headers and
    the other ``apply_async`` options."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Retried:
    """A retry a mode asked of the run (``Run.retry``), and the message it would publish."""

    exc: BaseException
    countdown: float
    counted: bool
    duplicate: bool
    message: Message


@dataclass(frozen=True)
class Ended:
    """How a run reported the end of its hold (``Run.released``)."""

    state: str | None
    held: bool
    hold: float


@dataclass(eq=False)
class FakeRun(Run):
    """The runtime's ``Run`` whose retries and hand-overs are recorded, not published."""

    retried: list[Retried] = field(default_factory=list)
    handed: list[Message] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)

    def retry(
        self,
        exc: BaseException,
        countdown: float,
        *,
        counted: bool = True,
        duplicate: bool = False,
    ) -> BaseException:
        """Record the retry (and the message it would publish: this call again, carrying
        its key, its lock retries and its per-call options, as ``Run.retry`` writes them);
        the ``Retry`` to raise, or ``exc`` for an eager run."""
        headers: dict[str, Any] = {**(self.request.headers or {}), hdr.HEADER_KEY: self.key}
        lock_retries = int(self.header(hdr.HEADER_LOCK_RETRIES) or 0) + (0 if counted else 1)
        if lock_retries:
            headers[hdr.HEADER_LOCK_RETRIES] = lock_retries
        if duplicate:
            headers[hdr.HEADER_DUPLICATE] = True
        message = Message(
            self.task_id,
            tuple(self.request.args or ()),
            dict(self.request.kwargs or {}),
            headers,
            {"countdown": countdown, "retries": int(self.request.retries or 0) + int(counted)},
        )
        self.retried.append(Retried(exc, countdown, counted, duplicate, message))
        if self.eager:
            return exc
        return Retry(exc=exc, when=countdown)  # type: ignore[arg-type]

    def publish_past_lock(self, call: HandedCall) -> None:
        """Record the call just handed the key, as the message ``publish_past_lock`` sends."""
        self.handed.append(_handed_message(call, self.key))

    def released(self, state: str | None, *, held: bool, hold: float = 0.0) -> None:
        self.ended.append(Ended(state, held, hold))
        super().released(state, held=held, hold=hold)


def _handed_message(call: HandedCall, key: str) -> Message:
    """The message ``publish_past_lock`` publishes for ``call``: its own headers and the key
    it was handed (the republish header)."""
    options = dict(call.options)
    headers = {**(options.pop("headers", None) or {}), hdr.HEADER_KEY: key}
    return Message(call.task_id, tuple(call.args), dict(call.kwargs), headers, options)


@dataclass(eq=False)
class FakePublish(Publish):
    """The runtime's ``Publish`` whose sends and hand-overs are recorded."""

    sent: list[Message] = field(default_factory=list)
    handed: list[Message] = field(default_factory=list)

    def publish_past_lock(self, call: HandedCall) -> None:
        self.handed.append(_handed_message(call, self.key()))


@dataclass
class Delivery:
    """One delivery and how it ended: the body ran (``ran``) and returned ``value``, or the
    delivery raised ``raised`` (a retry, ``Ignore``, ``TaskLocked``...)."""

    run: FakeRun
    ran: bool = False
    value: Any = None
    raised: BaseException | None = None

    @property
    def task_id(self) -> str:
        return self.run.task_id


@dataclass
class Published:
    """One ``apply_async``: what the caller got, the messages sent and the calls handed
    the key meanwhile."""

    call: FakePublish
    result: Any
    raised: BaseException | None = None

    @property
    def sent(self) -> list[Message]:
        return self.call.sent

    @property
    def handed(self) -> list[Message]:
        return self.call.handed


def job(name: str, n: int = 0, tenant: str = "t") -> int:
    """The task every fake test locks: keyed by ``name`` unless told otherwise."""
    return n


class Fake:
    """One Celery app whose locked tasks run as fake deliveries on a real lock Redis."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"fake{uuid.uuid4().hex[:8]}"
        self.app = Celery(f"fake-{self.prefix}", broker="memory://", backend="cache+memory://")
        self.app.conf.update(
            singleton_lock_url=url,
            singleton_lock_prefix=self.prefix,
            task_always_eager=False,
            broker_connection_retry=False,
        )
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def close(self) -> None:
        """Close the clients (the lock's client of the app, and ours)."""
        redis_for(self.app, self.url).close()
        self.redis.close()

    def task(self, func: Callable[..., Any] = job, **options: Any) -> Any:
        """A new locked task of ``func`` with these ``lock_*`` (and Celery) options; keyed
        by ``name`` unless ``lock_keys`` is given."""
        options.setdefault("lock_keys", ["name"])
        name = f"fake.{func.__name__}{next(_names)}"
        task = self.app.task(name=name, base=LockedTask, **options)(func)  # type: ignore[no-untyped-call]
        return self.app.tasks[task.name]

    @property
    def client(self) -> LockClient:
        """The app's lock Redis client (the one its runs' locks use)."""
        return redis_for(self.app, self.url)

    def holder(self, key: str) -> Holder | None:
        """Who holds lock ``key`` now, as the server says (None: free)."""
        return RedisLock(self.client, key).holder()

    # -- a delivery ----------------------------------------------------------------------

    def deliver(
        self,
        task: Any,
        *args: Any,
        task_id: str | None = None,
        headers: dict[str, Any] | None = None,
        retries: int = 0,
        body: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> Delivery:
        """Run one delivery of a message of ``task`` as a worker would: its request pushed,
        the run pipeline (``before_body``, then the body as the holder and ``finish``), the
        result stored on success, ``release_after_run`` as ``task_postrun`` calls it.
        ``body`` replaces the task's function (it may deliver or publish other calls while
        this run holds its key); the outcome is returned, never raised."""
        task_id = task_id or uuid.uuid4().hex
        request = {
            "id": task_id,
            "args": list(args),
            "kwargs": dict(kwargs),
            "headers": dict(headers or {}),
            "retries": retries,
            "is_eager": False,
            "called_directly": False,
            "delivery_info": {"exchange": "", "routing_key": "celery", "priority": 0},
            "hostname": "fake@localhost",
        }
        # A fresh request (``push_request`` would copy the one below it: a run's own).
        task.request_stack.push(Context(**request))
        ran: list[bool] = []

        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            ran.append(True)
            return body() if body is not None else task.run(*call_args, **call_kwargs)

        state: str = states.FAILURE
        try:
            real = resolve(task, task.request, tuple(args), dict(kwargs), call)
            assert real is not None, f"{task.name} is not locked"
            run = FakeRun(**{f.name: getattr(real, f.name) for f in dataclasses.fields(Run)})
            delivery = Delivery(run)
            try:
                delivery.value = before_body(run)()
                state = states.SUCCESS
            except BaseException as exc:  # the delivery's outcome, for the test to read
                delivery.raised = exc
                state = type(exc).__name__.upper()
            delivery.ran = bool(ran)
            if delivery.ran and state == states.SUCCESS:
                task.backend.mark_as_done(task_id, delivery.value, request=task.request)
        finally:
            release_after_run(task, task_id, state)
            task.pop_request()
        return delivery

    def deliver_message(
        self, task: Any, message: Message, body: Callable[[], Any] | None = None
    ) -> Delivery:
        """Deliver a recorded message (its task id, arguments and headers)."""
        return self.deliver(
            task,
            *message.args,
            task_id=message.task_id,
            headers=message.headers,
            retries=int(message.options.get("retries") or 0),
            body=body,
            **message.kwargs,
        )

    # -- a publish -----------------------------------------------------------------------

    def publish(self, task: Any, *args: Any, wait: float = 0.0, **kwargs: Any) -> Published:
        """One ``apply_async(args, kwargs)`` of ``task`` (``apply_async`` options under
        ``options=``), in the phases of ``locked_apply_async``: the ``before_publish``
        hooks, then, in a scope that locks at publish, the queue lock and on conflict the
        policy's ``publish_conflict``. Sends are recorded; the outcome is never raised."""
        options = dict(kwargs.pop("options", None) or {})
        locking = locking_for(task)
        assert locking is not None, f"{task.name} is not locked"
        locking = _with_call_options(task, locking, options)
        call = FakePublish(task, _never_sent, tuple(args), dict(kwargs), options, locking)
        call.send_func = _recorder(task, call.sent)
        published = Published(call, None)
        try:
            published.result = self._publish(call, wait)
        except BaseException as exc:  # the caller's outcome, for the test to read
            published.raised = exc
        return published

    @staticmethod
    def _publish(call: FakePublish, wait: float) -> Any:
        plan = call.locking.plan
        for mode in plan.before_publish:
            result = mode.before_publish(call)
            if result is not None:
                return result
        if not plan.scope.at_publish:
            return call.send()
        return _queue_lock(call, wait)


def _never_sent(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("replaced by the recorder")  # pragma: no cover


def _recorder(task: Any, sent: list[Message]) -> Callable[..., Any]:
    """A stand-in for Celery's ``apply_async`` that records the message it would send."""

    def send(args: Any, kwargs: Any, **options: Any) -> AsyncResult[Any]:
        task_id = options.pop("task_id", None) or uuid.uuid4().hex
        headers = dict(options.pop("headers", None) or {})
        sent.append(Message(task_id, tuple(args or ()), dict(kwargs or {}), headers, options))
        return task.AsyncResult(task_id)  # type: ignore[no-any-return]

    return send


@contextlib.contextmanager
def fake_for(url: str) -> Iterator[Fake]:
    """A :class:`Fake` on the lock Redis at ``url``, closed at the end."""
    fake = Fake(url)
    try:
        yield fake
    finally:
        fake.close()

"""What happens when a locked task runs or is published; shared by ``LockedTask`` and by
tasks locked through ``singleton_lock_tasks``.

Run scope takes the lock just before the body and releases it when the run ends. Queue scope
takes it in ``apply_async`` with an owner token derived from the task id, so the run of that
very message (and its retries) owns it, and a duplicate call publishes nothing. Everything a
task needs for this (its options, the app's settings, the Redis client) is resolved once per
task and app (:func:`locking_for`); the lock a run holds lives on that run's request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Task as CeleryTask
from celery import states
from celery.exceptions import Ignore, ImproperlyConfigured, Reject, Retry
from celery.utils import uuid
from kombu.serialization import dumps, loads

from celery_singleton_lock import _modes, debounce, followup
from celery_singleton_lock import _observe as observe
from celery_singleton_lock.client import LockClient, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import Holder, RedisLock, companion_key
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError, LockNotOwned, TaskLocked
from celery_singleton_lock.keys import check_lock_keys, task_lock_key
from celery_singleton_lock.options import (
    FOLLOWUP_POLICIES,
    TASK_OPTION_PREFIX,
    LockOptions,
    Settings,
    check_combinations,
    validate_task_options,
)

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

    AnyTask = Task[Any, Any]
    AnyResult = AsyncResult[Any]
else:
    AnyTask = Any
    AnyResult = Any

__all__ = [
    "HEADER_KEY",
    "LOCKED_MARKER",
    "TaskLocking",
    "current_lock",
    "lock_key_method",
    "locked_apply_async",
    "locked_call",
    "locking_for",
    "release_after_run",
    "release_for_lost_run",
]

log = logging.getLogger("celery_singleton_lock.task")

#: Class attribute that marks a task class whose own ``lock_*`` attributes count.
LOCKED_MARKER = "__singleton_lock__"
#: Methods of locked tasks whose names look like options.
TASK_METHODS = frozenset({"lock_key"})
#: Options of the packages people migrate from, refused on a LockedTask with a pointer.
FOREIGN_OPTIONS = {
    "unique_on": "celery-singleton's name: use lock_keys, or compat.singleton.Singleton",
    "raise_on_duplicate": "celery-singleton's name: use lock_on_conflict='raise'",
    "lock_expiry": "celery-singleton's name: use lock_timeout",
    "once": "celery-once's option: use lock_* options, or compat.once.QueueOnce",
}
#: Class attribute of a task class listing the foreign options it understands (the compat
#: base classes).
FOREIGN_ALLOWED = "singleton_lock_foreign_options"
#: Method of a task class, ``(settings, own options) -> (settings, own options)``, that adapts
#: how its tasks lock before the options are validated: the compat base classes map their
#: predecessors' options and settings there.
ADAPT_HOOK = "singleton_lock_adapt"
#: Message header carrying the ``lock_*`` options given to one call.
HEADER_OPTIONS = "singleton_lock_options"
#: Message header that carries a queue-scope lock's key from the producer to the run.
HEADER_KEY = "singleton_lock_key"
#: Attribute of a run's request (Celery's ``Context``) that holds the lock it took.
_REQUEST_ATTR = "singleton_lock"
#: Header of a message republished because an earlier delivery of it held the lock: when
#: it runs, it first checks that the earlier one did not finish the work.
HEADER_DUPLICATE = "singleton_lock_duplicate"
#: Suffix of the key that remembers the last finished queue-scope run of a lock.
DONE_SUFFIX = "done"
#: ``apply_async`` option of a retry that the lock layer itself asks for (the lock was
#: busy or unreachable): publish it as it is, never blocked or lost on the queue lock.
REPUBLISH_OPTION = "singleton_lock_republish"
#: ``apply_async`` option: seconds a queue-scope publish waits for a busy lock before it
#: counts as a duplicate (None: no limit); 0, the default, does not wait.
PUBLISH_WAIT_OPTION = "singleton_lock_publish_wait"
#: The automatic countdown of a retry never goes below this many seconds.
_MIN_COUNTDOWN = 0.5
#: Retries after a Redis outage wait at most this long (seconds) before trying again.
_OUTAGE_COUNTDOWN = 5.0
#: How often the worker parent looks whether a lost run's process has exited, and how
#: often it asks Redis whether that run still holds its lock meanwhile.
_PID_POLL_INTERVAL = 0.05
_HOLD_CHECK_INTERVAL = 1.0
_HOST = socket.gethostname()

_current: ContextVar[RedisLock | None] = ContextVar("singleton_lock_current", default=None)


def current_lock() -> RedisLock | None:
    """The lock held by the task running in this thread or context, or None."""
    return _current.get()


def lock_prefix(task: AnyTask) -> str:
    """The ``singleton_lock_prefix`` of ``task``'s app."""
    return settings_for(task.app).prefix


def queue_token(task_id: str, limit: int = 1) -> str:
    """The owner token of a queue-scope lock: a function of the task id alone, so the
    producer, the run and every retry of that message are the same owner. With slots
    (``limit`` > 1) it belongs to the task's group, so it never holds a second slot."""
    if limit > 1:
        return task_group(task_id) + "q"
    if ":" in task_id or not task_id:
        return "q-" + hashlib.sha256(task_id.encode()).hexdigest()[:32]
    return "q-" + task_id


def task_group(task_id: str) -> str:
    """The token prefix of every hold of one task id (its publish and its deliveries): a
    lock with slots never gives one group two slots."""
    return "t" + hashlib.sha256(task_id.encode()).hexdigest()[:16] + "-"


def task_holder(lock: RedisLock, task_id: str) -> Holder | None:
    """The hold of ``task_id`` on ``lock`` (on any of its slots), or None."""
    return next((holder for holder in lock.holders() if holder.task_id == task_id), None)


@dataclass(frozen=True)
class TaskLocking:
    """Everything one task needs to lock its calls, resolved once per task and app."""

    task_name: str
    func: Callable[..., Any]
    settings: Settings
    options: LockOptions
    serializer: str = "json"

    def key(
        self, args: Any, kwargs: Any, *, received: bool = False, serializer: str | None = None
    ) -> str:
        """The lock key of a call with these arguments. Unless they were ``received`` from a
        message, they are first put through the message serializer and back, so the
        producer computes the key from what the worker will see (a JSON round trip turns
        tuples into lists, int dict keys into strings, enums into their values)."""
        if not received:
            args, kwargs = wire_form(args, kwargs, serializer or self.serializer)
        return task_lock_key(
            self.settings.prefix, self.task_name, self.func, tuple(args or ()),
            dict(kwargs or {}), self.options.keys,
        )  # fmt: skip

    def with_call_options(self, given: Mapping[str, Any]) -> TaskLocking:
        """This task's locking with the ``lock_*`` options of one call applied."""
        if not given:
            return self
        changes = {name.removeprefix(TASK_OPTION_PREFIX): value for name, value in given.items()}
        options = dataclasses.replace(self.options, **changes)
        check_combinations(options, f"task {self.task_name!r} with per-call options", self.settings)
        return dataclasses.replace(self, options=options)

    def client(self, app: Any) -> LockClient:
        """The lock Redis client of ``app`` in this process."""
        return redis_for(app, self.settings.url)

    def new_lock(
        self, app: Any, key: str, task_id: str, *, queued: bool = False, claim: str | None = None
    ) -> RedisLock:
        """The RedisLock of a publish (``queued``) or of one delivery's run of the task.

        A queue-scope publish holds the lock under a token derived from the task id; the
        delivery that runs the message claims that hold under a token of its own, so a
        second delivery of the same message (broker redelivery, a task id published twice)
        is a rival, never the same owner. ``claim`` overrides the token to take over.
        """
        info: dict[str, Any] = {
            "task_id": task_id, "task": self.task_name, "host": _HOST, "pid": os.getpid(),
        }  # fmt: skip
        if queued:
            info["queued"] = True
        options = self.options
        if claim is None and options.scope == "queue" and not queued:
            claim = queue_token(task_id, options.limit)
        return observe.RunLock(
            self.client(app),
            key,
            timeout=options.queue_timeout if queued else options.timeout,
            auto_renew=options.renew and not queued,
            scripting=self.settings.scripting,
            token=queue_token(task_id, options.limit) if queued else None,
            claim=claim,
            limit=options.limit,
            group=task_group(task_id) if options.limit > 1 else None,
            holder_info=json.dumps(info, sort_keys=True, separators=(",", ":")),
            replicas=options.replicas,
        )


_JSON_SCALARS = (str, int, bool, type(None))
#: Nesting deeper than this takes the serializer round trip (and its own limits).
_JSON_DEPTH = 32


def _as_json_reads(value: Any, depth: int = 0) -> Any:
    """``value`` as a JSON round trip gives it back (tuples become lists), or ``_NOT_NATIVE``
    when that is not plainly so (any other type, a non-finite float, a non-str dict key)."""
    kind = type(value)  # exact types: an IntEnum or a str Enum reads back as its value
    if kind in _JSON_SCALARS or (kind is float and math.isfinite(value)):
        return value  # a finite float's repr round-trips exactly
    if depth >= _JSON_DEPTH:
        return _NOT_NATIVE
    if type(value) in (list, tuple):
        items = [_as_json_reads(item, depth + 1) for item in value]
        return _NOT_NATIVE if any(item is _NOT_NATIVE for item in items) else items
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                return _NOT_NATIVE
            out[key] = converted = _as_json_reads(item, depth + 1)
            if converted is _NOT_NATIVE:
                return _NOT_NATIVE
        return out
    return _NOT_NATIVE


_NOT_NATIVE = object()


def wire_form(args: Any, kwargs: Any, serializer: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` as a worker deserializes them from a message written with
    ``serializer``; unchanged when they do not serialize (publishing them fails anyway).
    Plain JSON values under the json serializer are converted directly (what the round
    trip would give, without encoding the message twice)."""
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    if serializer == "json":
        native = _as_json_reads([list(args), kwargs])
        if native is not _NOT_NATIVE:
            return tuple(native[0]), dict(native[1])
    try:
        content_type, encoding, body = dumps([list(args), kwargs], serializer=serializer)
        back = loads(body, content_type, encoding, accept={content_type})
        return tuple(back[0]), dict(back[1])
    except Exception:  # noqa: BLE001 - any serializer error: keep the arguments as given
        return args, kwargs


def own_options(task: AnyTask) -> dict[str, Any] | None:
    """The ``lock_*`` attributes a ``LockedTask`` set for itself, typos included so that
    validation can name them (None for a task that is not a ``LockedTask``)."""
    cls = type(task)
    if not getattr(cls, LOCKED_MARKER, False):
        return None
    for name, hint in FOREIGN_OPTIONS.items():
        if name not in getattr(cls, FOREIGN_ALLOWED, ()) and name in dir(cls):
            raise ImproperlyConfigured(f"task {task.name!r}: unknown option {name!r} ({hint})")
    own: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith(TASK_OPTION_PREFIX) and name not in TASK_METHODS:
            value = inspect.getattr_static(cls, name)
            own[name] = value.__func__ if isinstance(value, staticmethod) else value
    if own.get("lock_keys") is None:
        own.pop("lock_keys", None)
    return own


def locking_for(task: AnyTask) -> TaskLocking | None:
    """How ``task`` locks (None when it is not locked); validated on first use and cached on
    the task until the app's settings are re-read, so a bad option is reported before any
    body runs."""
    settings = settings_for(task.app)
    cached = task.__dict__.get("_singleton_lock")
    if cached is not None and cached[0] is settings:
        return cached[1]  # type: ignore[no-any-return]
    own, adapt = own_options(task), getattr(task, ADAPT_HOOK, None)
    effective = settings
    if adapt is not None:
        effective, own = adapt(settings, own)
    options = effective.options_for(task.name, own)
    locking = None
    if options is not None:
        try:
            check_lock_keys(task.run, options.keys)
        except ValueError as exc:
            raise ImproperlyConfigured(f"lock_keys of task {task.name!r}: {exc}") from exc
        serializer = getattr(task, "serializer", None) or task.app.conf.task_serializer
        locking = TaskLocking(task.name, task.run, effective, options, str(serializer))
    task.__dict__["_singleton_lock"] = (settings, locking)
    return locking


def lock_key(task: AnyTask, args: Any, kwargs: Any) -> str:
    """The full Redis key a call of ``task`` with these arguments locks."""
    locking = locking_for(task)
    if locking is None:
        raise ImproperlyConfigured(
            f"task {task.name!r} is not locked: it is not a LockedTask and no "
            "singleton_lock_tasks glob matches it"
        )
    return locking.key(args, kwargs)


def lock_key_method(self: AnyTask, *args: Any, **kwargs: Any) -> str:
    """The full Redis key that a call with these arguments locks (the same string on the
    producer and in the worker). Installed as ``task.lock_key`` on every locked task."""
    return lock_key(self, args, kwargs)


def _header(request: Any, name: str) -> Any:
    """A header of the message being run, wherever Celery put it (a worker makes headers
    request attributes; an eager run keeps them in ``request.headers``)."""
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name)
    return value


def _header_key(request: Any) -> str | None:
    """The queue-scope key carried by the message."""
    value = _header(request, HEADER_KEY)
    return str(value) if value else None


def pop_call_options(task_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Take the ``lock_*`` options out of one call's ``apply_async`` options, validated
    (an unknown name is ImproperlyConfigured with a suggestion)."""
    given = {
        name: options.pop(name) for name in list(options) if name.startswith(TASK_OPTION_PREFIX)
    }
    if not given:
        return {}
    if callable(given.get("lock_keys")):
        raise ImproperlyConfigured(
            f"task {task_name!r}: a per-call lock_keys must be a list of parameter names "
            "(a callable cannot travel with the message)"
        )
    return validate_task_options(given, f"apply_async of task {task_name!r}")


def _run_locking(task: AnyTask, request: Any) -> TaskLocking | None:
    """How this run locks: the task's locking with the options its message carries."""
    locking = locking_for(task)
    if locking is None:
        return None
    carried = _header(request, HEADER_OPTIONS)
    if not carried:
        return locking
    return locking.with_call_options(
        validate_task_options(carried, f"message options of task {task.name!r}")
    )


# -- running ---------------------------------------------------------------------------


def _body(task: AnyTask, call: Any) -> Callable[..., Any]:
    """What runs the body: ``call`` (the next ``__call__`` in the class hierarchy, so a base
    class's own ``__call__`` — an app context, a DB session, tracing — wraps the locked body),
    or ``task.run`` when that is only Celery's ``Task.__call__``, which in an eager run would
    push a second, empty request around the body."""
    func = getattr(call, "__func__", None) or getattr(call, "func", None)
    return task.run if func is CeleryTask.__call__ else call


def locked_call(task: AnyTask, args: tuple[Any, ...], kwargs: dict[str, Any], call: Any) -> Any:
    """Run the body of ``task`` under its lock (``call`` is the unlocked ``__call__``)."""
    request = task.request
    if request.called_directly or getattr(request, _REQUEST_ATTR, None) is not None:
        # A plain function call (perhaps from inside the task's own locked run, which it
        # sees as its request): not a task run, no lock.
        return call(*args, **kwargs)
    locking = _run_locking(task, request)
    if locking is None:
        return call(*args, **kwargs)
    options = locking.options
    key = (_header_key(request) if options.scope == "queue" else None) or locking.key(
        args, kwargs, received=not request.is_eager
    )
    task_id = str(request.id)
    generation = _header(request, debounce.HEADER_DEBOUNCE)
    if generation is not None and not debounce.is_latest(
        locking.client(task.app), key, task_id=task_id, generation=generation
    ):
        observe.debounced(task, key, task_id, generation=int(generation))
        debounce.end_stale(task, task_id, generation)
    lock = locking.new_lock(task.app, key, task_id)
    started = time.monotonic()
    try:
        acquired = lock.acquire(blocking=False)
        if not acquired and options.on_conflict == "wait":
            _log_wait(task, task_id, lock, options.wait)
            observe.conflict(task, key, task_id, policy="wait", scope=options.scope, lock=lock)
            acquired = lock.acquire(blocking=True, timeout=options.wait)
    except LockBackendError as exc:
        if locking.settings.fail_open:
            log.warning(
                "singleton lock unavailable for %s[%s] (%s): running UNLOCKED because "
                "singleton_lock_fail_open is set", task.name, request.id, exc,
            )  # fmt: skip
            return _body(task, call)(*args, **kwargs)
        log.error("singleton lock unavailable for %s[%s]: %s; retrying", task.name, request.id, exc)
        countdown = _jitter(min(_OUTAGE_COUNTDOWN, options.timeout))
        # Fail closed without losing the message: retry until the lock Redis answers,
        # whatever the task's max_retries (an outage is not the task's failure).
        raise _retry(task, exc, countdown, key, max_retries=int(request.retries or 0) + 1) from exc
    if not acquired and not _reclaim_from_dead_delivery(task, lock):
        if options.on_conflict == "replace":
            by = followup.superseded_by(lock, task_id)
            if by is not None:
                observe.superseded(task, key, task_id, by=by, running=False)
                followup.end_superseded(task, task_id, by)
        return _on_conflict(task, lock, key, options)
    if options.scope == "queue" and _maybe_duplicate(request) and _finished(lock, task_id):
        lock.release()
        log.info("%s[%s] not run again: an earlier delivery of it finished", task.name, task_id)
        return None
    if options.rate_limit is not None and not _modes.admit(
        task, lock, key, options, started=started, fail_open=locking.settings.fail_open,
        prefix=locking.settings.prefix,
        retry=lambda exc, countdown, **retry_options: _retry(
            task, exc, countdown, key, **retry_options
        ),
        queued=lambda: locking.new_lock(task.app, key, task_id, queued=True, claim=lock.token),
    ):  # fmt: skip
        return None  # throttled and skipped
    observe.acquired(task, lock, task_id, options, started)
    if options.release == "start":
        _modes.release_at_start(task, lock, task_id, options)
        return _body(task, call)(*args, **kwargs)  # nothing held: current_lock() is None
    setattr(request, _REQUEST_ATTR, (lock, options))
    return _run_holding(task, task_id, lock, lambda: _body(task, call)(*args, **kwargs))


def _run_holding(task: AnyTask, task_id: str, lock: RedisLock, body: Callable[[], Any]) -> Any:
    """Run ``body`` as the holder of ``lock`` (``current_lock()``), then release it, before
    Celery stores the result: whoever sees the result (or ``task_success``) and calls again
    finds the key free."""
    context = _current.set(lock)
    state: str = states.FAILURE
    try:
        result = body()
        state = states.SUCCESS
        return result
    except Retry:
        state = states.RETRY
        raise
    except Ignore:
        state = states.IGNORED
        raise
    except Reject:
        state = states.REJECTED
        raise
    finally:
        _current.reset(context)
        release_after_run(task, task_id, state)


def _maybe_duplicate(request: Any) -> bool:
    """Whether this delivery may repeat one that already ran: a broker redelivery, or a
    message republished because an earlier delivery of it held the lock."""
    delivery = getattr(request, "delivery_info", None) or {}
    return bool(_header(request, HEADER_DUPLICATE) or delivery.get("redelivered"))


def done_key(key: str) -> str:
    """Where the id of the last queue-scope run of ``key`` that finished is kept."""
    return companion_key(key, DONE_SUFFIX)


def _known_task(lock: RedisLock, task_id: str) -> bool:
    """Whether ``task_id`` holds ``lock`` now or finished a run under it recently."""
    if task_holder(lock, task_id) is not None:
        return True
    return _finished(lock, task_id)


def _finished(lock: RedisLock, task_id: str) -> bool:
    """Whether a run of ``task_id`` finished under ``lock``'s key within the queue lease."""
    done = call(lock.name, lock.client.get, done_key(lock.name))
    return done is not None and (done.decode() if isinstance(done, bytes) else done) == task_id


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _log_wait(task: AnyTask, task_id: str, lock: RedisLock, limit: float | None) -> None:
    """Say at INFO that a run starts waiting, for what and for how long at most, so a
    worker that waits minutes does not look hung."""
    if not log.isEnabledFor(logging.INFO):
        return
    holder = lock.holder()
    held_by = f"task {holder.task_id}" if holder and holder.task_id else "another holder"
    log.info(
        "%s[%s] waiting for lock %s held by %s (%s)", task.name, task_id, lock.name, held_by,
        f"at most {limit:g} s, lock_wait" if limit is not None else "no limit: lock_wait=None",
    )  # fmt: skip


def _jitter(seconds: float) -> float:
    return seconds * (1 + random.uniform(0, 0.25))


def _process_gone(pid: object) -> bool:
    """Whether ``pid`` names no running process on this host (an exited child that its
    parent has not reaped yet, a zombie, counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def _reclaim_from_dead_delivery(task: AnyTask, lock: RedisLock) -> bool:
    """Take the lock over from an earlier delivery of this very message whose process died
    holding it (acks_late + reject_on_worker_lost requeues without any failure signal):
    only when the holder is this task id, on this host, in a process that no longer exists."""
    holder = task_holder(lock, str(task.request.id))
    if holder is None or holder.token is None:
        return False
    if holder.info.get("host") != _HOST or not _process_gone(holder.info.get("pid")):
        return False
    dead = RedisLock(lock.client, lock.name, token=holder.token, scripting=lock.scripting,
                     limit=lock.limit)  # fmt: skip
    try:
        dead.release()
    except LockNotOwned:
        return False
    log.warning(
        "%s[%s]: took over the lock its dead earlier delivery held", task.name, task.request.id
    )
    return lock.acquire(blocking=False)


def _retry(
    task: AnyTask,
    exc: BaseException,
    countdown: float,
    key: str,
    *,
    duplicate: bool = False,
    **options: Any,
) -> BaseException:
    """``task.retry`` for a lock that was busy or unreachable: the retried message carries
    this run's key and options and is published past the queue lock (which may be held by
    someone else, or unreachable), so it can neither be dropped nor stay in RETRY."""
    headers: dict[str, Any] = {HEADER_KEY: key}
    if duplicate:
        headers[HEADER_DUPLICATE] = True
    carried = _header(task.request, HEADER_OPTIONS)
    if carried:
        headers[HEADER_OPTIONS] = carried
    options[REPUBLISH_OPTION] = headers
    retry: Callable[..., BaseException] = task.retry
    return retry(exc=exc, countdown=countdown, **options)


def _countdown(options: LockOptions, holder: Holder | None, retries: int) -> float:
    """When a busy run comes back: ``lock_retry_delay`` when set; else one second doubling
    with each retry, never past the holder's remaining lease (a renewed lease says nothing
    about when the holder will finish)."""
    if options.retry_delay is not None:
        return options.retry_delay
    backoff = _MIN_COUNTDOWN * 2 ** min(retries + 1, 16)
    left = (holder.remaining_ms or 1000) / 1000 if holder else 1.0
    return _jitter(max(_MIN_COUNTDOWN, min(backoff, left, options.timeout)))


def _on_conflict(task: AnyTask, lock: RedisLock, key: str, options: LockOptions) -> Any:
    """Apply the conflict policy when another run holds ``key``."""
    task_id = str(task.request.id)
    holders = lock.holders()
    # An earlier delivery of this very message, else the newest holder (of any slot).
    holder = next((found for found in holders if found.task_id == task_id), None) or max(
        holders, key=lambda found: found.fence or 0, default=None
    )
    holder_id = holder.task_id if holder else None
    retries = int(task.request.retries or 0)

    def tell(policy: str) -> None:
        observe.conflict(
            task, key, task_id, policy=policy, scope=options.scope, holder_task_id=holder_id
        )

    if holder is not None and holder_id == task.request.id:
        # An earlier delivery of this same message still holds it (alive elsewhere, or not
        # provably dead): skipping would drop the work, so come back later.
        exc = TaskLocked(key, holder_id)
        countdown = _countdown(options, holder, retries)
        tell("retry")
        raise _retry(task, exc, countdown, key, duplicate=True, max_retries=retries + 1)
    if options.on_conflict == "skip" and retries:
        # A retried run (its own self.retry(), or a retry the lock asked for) is the work
        # itself, not a duplicate of it: skipping it would drop that work. Come back.
        exc = TaskLocked(key, holder_id)
        countdown = _countdown(options, holder, retries)
        tell("retry")
        raise _retry(task, exc, countdown, key, max_retries=retries + 1)
    if options.on_conflict == "skip":
        log.info("%s[%s] skipped: %s is held by %s", task.name, task.request.id, key, holder_id)
        tell("skip")
        observe.skipped(
            task, lock.client, prefix=lock_prefix(task), key=key, task_id=task_id,
            holder_task_id=holder_id,
        )  # fmt: skip
        return None
    if options.on_conflict in ("retry", *FOLLOWUP_POLICIES):
        # Under coalesce or replace a run whose queued lock was lost meanwhile comes back.
        tell("retry")
        raise _retry(task, TaskLocked(key, holder_id), _countdown(options, holder, retries), key)
    if options.on_conflict == "raise":
        tell("raise")
    raise TaskLocked(key, holder_id)  # "raise", and "wait" that timed out


def release_after_run(task: AnyTask, task_id: str, state: str | None) -> None:
    """Release the lock the current run of ``task`` took: at the end of its body, and from
    ``task_postrun`` should a run end without passing there."""
    request = task.request
    entry = getattr(request, _REQUEST_ATTR, None)
    if entry is None:
        return
    setattr(request, _REQUEST_ATTR, None)
    lock, options = entry
    if lock.lease_lost:
        observe.lost(task, lock, task_id, options)
    retried = state == states.RETRY
    if retried and options.scope == "queue" and lock.fencing_token is None:
        return  # the retried message took this hold over (and detached it) when published
    # A retry that did not take the hold over (it locks other arguments, or was published
    # past a held key) frees it now rather than leave it to its lease. Any other end of a
    # queue-scope run also records that this task id finished (in the same round trip), so
    # a late duplicate delivery of its message does not run it again.
    record = None
    if options.scope == "queue" and not retried:
        record = (done_key(lock.name), task_id, _ms(options.queue_timeout))
    if record is not None and options.on_conflict in FOLLOWUP_POLICIES:
        try:
            takeover = followup.hand_over(options, lock, record)
        except LockBackendError as exc:
            log.error("could not hand %s over to its follow-up: %s", lock.name, exc)
            takeover = None
        if takeover is not None:
            observe.released(task, lock, task_id, options, state)
            _publish_followup(task, lock.name, takeover, options.limit)
            return
    if state == states.SUCCESS and _modes.hold_after_success(task, lock, task_id, options, record):
        return  # lock_release="success": the key stays held lock_hold seconds
    try:
        lock.release(record=record)
    except LockNotOwned:
        log.warning("lock %s of task %s had expired before the run ended", lock.name, task_id)
        observe.lost(task, lock, task_id, options)
    except LockBackendError as exc:
        log.error("could not release lock %s of task %s: %s", lock.name, task_id, exc)
    else:
        observe.released(task, lock, task_id, options, state)


def release_for_lost_run(task: AnyTask, task_id: str, args: Any, kwargs: Any, request: Any) -> bool:
    """Free the lock of a run that can no longer release it (its process was killed, or it
    was revoked): only if the holder recorded in Redis is that very task id, and only once
    the process that ran the body has stopped — a child told to terminate may still be
    running it. Returns whether it was released now (else it is released when that process
    exits, or left to its lease)."""
    locking = _run_locking(task, request)
    if locking is None:
        return False
    key = _header_key(request) or locking.key(args, kwargs, received=True)
    probe = locking.new_lock(task.app, key, task_id)
    holder = task_holder(probe, task_id)
    if holder is None or holder.token is None:
        return False
    owner = RedisLock(probe.client, key, token=holder.token, scripting=locking.settings.scripting,
                      limit=locking.options.limit)  # fmt: skip
    lost = _LostRun(task, task_id, locking.options)
    if holder.info.get("queued") is True:
        return _release_lost(owner, lost)  # taken at publish, never ran
    pid = holder.info.get("pid")
    if holder.info.get("host") != _HOST or not isinstance(pid, int):
        return False  # not a process of this host: its lease decides
    if not _process_gone(pid):
        threading.Thread(
            target=_release_when_gone, args=(owner, pid, lost),
            name=f"singleton-lock-release-{task_id}", daemon=True,
        ).start()  # fmt: skip
        return False
    return _release_lost(owner, lost)


@dataclass(frozen=True)
class _LostRun:
    """The run whose lock is freed by someone else (its worker's parent, a revoke)."""

    task: AnyTask
    task_id: str
    options: LockOptions


def _release_lost(owner: RedisLock, lost: _LostRun) -> bool:
    """Free a lost run's lock (owner-checked), handing it to a pending follow-up if any."""
    options, name = lost.options, lost.task.name
    if options.scope == "queue" and options.on_conflict in FOLLOWUP_POLICIES:
        takeover = followup.hand_over(options, owner)
        if takeover is not None:
            log.warning("lock %s of lost or revoked task %s[%s] handed to its follow-up",
                        owner.name, name, lost.task_id)  # fmt: skip
            _publish_followup(lost.task, owner.name, takeover, options.limit)
            return True
    try:
        owner.release()
    except LockNotOwned:
        return False
    log.warning("released lock %s of lost or revoked task %s[%s]", owner.name, name, lost.task_id)
    return True


def _release_when_gone(owner: RedisLock, pid: int, lost: _LostRun) -> None:
    """Wait for process ``pid`` to stop, then release; give up once the lock is no longer
    held by that run (it released it itself, or its lease ran out)."""
    next_check = time.monotonic() + _HOLD_CHECK_INTERVAL
    try:
        while not _process_gone(pid):
            time.sleep(_PID_POLL_INTERVAL)
            if time.monotonic() >= next_check:
                if not owner.owned():
                    return
                next_check = time.monotonic() + _HOLD_CHECK_INTERVAL
        _release_lost(owner, lost)
    except Exception:  # a background thread must never take the worker down
        log.exception(
            "could not release lock %s of lost task %s[%s]",
            owner.name,
            lost.task.name,
            lost.task_id,
        )


# -- publishing ------------------------------------------------------------------------


def _apply_call_options(
    task: AnyTask, locking: TaskLocking, options: dict[str, Any]
) -> TaskLocking:
    """Take the ``lock_*`` options of one call out of ``options``: the task's locking with
    them applied, and the message carries them (a header) to the run."""
    given = pop_call_options(task.name, options)
    if not given:
        return locking
    headers = dict(options.pop("headers", None) or {})
    headers[HEADER_OPTIONS] = {
        name: list(value) if isinstance(value, tuple) else value for name, value in given.items()
    }
    options["headers"] = headers
    return locking.with_call_options(given)


def locked_apply_async(
    task: AnyTask, publish: Callable[..., AnyResult], args: Any, kwargs: Any, **options: Any
) -> AnyResult:
    """``apply_async`` for queue scope: take the lock, then publish; a duplicate publishes
    nothing and gets the holder's AsyncResult (or TaskLocked under ``raise``)."""
    republish = options.pop(REPUBLISH_OPTION, None)
    wait = options.pop(PUBLISH_WAIT_OPTION, 0.0)
    if republish is not None:
        headers = {**(options.pop("headers", None) or {}), **republish}
        return publish(args, kwargs, headers=headers, **options)
    locking = locking_for(task)
    if locking is None:
        return publish(args, kwargs, **options)
    locking = _apply_call_options(task, locking, options)
    if locking.options.debounce is not None:
        return _debounced(task, publish, locking, args=args, kwargs=kwargs, options=options)
    if locking.options.scope != "queue":
        return publish(args, kwargs, **options)
    explicit_id = options.pop("task_id", None)
    task_id = explicit_id or uuid()
    key = locking.key(args, kwargs, serializer=options.get("serializer"))
    running = current_lock()
    handing_over = running is not None and running.name == key and task.request.id == task_id
    # self.retry() of a run that freed its key at its start (lock_release="start") is the
    # work itself: published even when another message holds the key now.
    own_retry = handing_over or _modes.released_at_start(task, key, task_id)
    claim = running.token if handing_over else None  # type: ignore[union-attr]
    if handing_over:
        # self.retry() of this very run: the retried message takes the run's hold over.
        running.detach()  # type: ignore[union-attr]
    lock = locking.new_lock(task.app, key, task_id, queued=True, claim=claim)
    try:
        if explicit_id and not handing_over and _known_task(lock, task_id):
            log.info("%s[%s] not published again: that task id is queued, running or done",
                     task.name, task_id)  # fmt: skip
            return task.AsyncResult(task_id)
        acquired = lock.acquire(blocking=wait != 0, timeout=wait)
    except LockBackendError as exc:
        if not own_retry and not locking.settings.fail_open:
            raise
        if not own_retry:
            log.warning("singleton lock unavailable: publishing %s[%s] unlocked", task.name,
                        task_id)  # fmt: skip
            return publish(args, kwargs, task_id=task_id, **options)
        # self.retry() of this very run (or of one that freed its key at its start): the
        # retried message is the work itself, and Celery drops a message whose retry cannot
        # be published. It takes the lock when it runs.
        log.warning("%s[%s]: lock Redis unreachable at its retry (%s); publishing the retry, "
                    "which takes %s when it runs", task.name, task_id, exc, key)  # fmt: skip
        acquired = True
    if not acquired and own_retry:
        log.warning("%s[%s]: could not take %s for its retry (its lease ended, or it freed "
                    "at the start); retrying unlocked until it can take it again", task.name,
                    task_id, key)  # fmt: skip
        acquired = True
    if not acquired and locking.options.on_conflict in FOLLOWUP_POLICIES:
        return _follow(task, publish, locking, key, task_id=task_id, args=args, kwargs=kwargs,
                       options=options)  # fmt: skip
    if not acquired:
        acquired, holder = _holder_or_take(lock)
    if not acquired:
        holder_id = holder.task_id if holder else None
        if locking.options.on_conflict == "raise" or holder_id is None:
            observe.conflict(
                task, key, None, policy="raise", scope="queue", holder_task_id=holder_id
            )
            raise TaskLocked(key, holder_id)
        observe.conflict(task, key, None, policy="skip", scope="queue", holder_task_id=holder_id)
        log.info("%s not published: %s is queued or running as %s", task.name, key, holder_id)
        return task.AsyncResult(holder_id)
    return _publish_locked(publish, lock, key, task_id=task_id, args=args, kwargs=kwargs,
                           options=options)  # fmt: skip


def _holder_or_take(lock: RedisLock, attempts: int = 3) -> tuple[bool, Holder | None]:
    """``(taken, holder)`` after a refused acquire: the holder of ``lock``, or, when it was
    freed in between (its run just ended), the lock taken after all."""
    holder = None
    for _ in range(attempts):
        holder = lock.holder()
        if holder is not None:
            return False, holder
        if lock.acquire(blocking=False):
            return True, None
    return False, holder


def _debounced(
    task: AnyTask, publish: Callable[..., AnyResult], locking: TaskLocking, *, args: Any,
    kwargs: Any, options: dict[str, Any],
) -> AnyResult:  # fmt: skip
    """A debounced call joins its key's burst (see :mod:`.debounce`) and is published under
    the burst's task id, due when the burst is; the lock is taken when that run starts."""
    key = locking.key(args, kwargs, serializer=options.get("serializer"))
    task_id = options.pop("task_id", None) or uuid()
    for timing in ("countdown", "eta"):
        options.pop(timing, None)
    opts = locking.options
    burst = debounce.join(locking.client(task.app), key, task_id, quiet=opts.debounce or 0.0,
                          max_wait=opts.debounce_max_wait)  # fmt: skip
    if burst.generation > 1:
        observe.conflict(task, key, None, policy="debounce", scope=opts.scope,
                         holder_task_id=burst.task_id)  # fmt: skip
    headers = dict(options.pop("headers", None) or {})
    headers[debounce.HEADER_DEBOUNCE] = burst.generation
    headers[HEADER_KEY] = key
    return publish(args, kwargs, task_id=burst.task_id, countdown=burst.countdown,
                   headers=headers, **options)  # fmt: skip


def _publish_locked(
    publish: Callable[..., AnyResult], lock: RedisLock, key: str, *, task_id: str, args: Any,
    kwargs: Any, options: dict[str, Any],
) -> AnyResult:  # fmt: skip
    """Publish a call whose queue lock ``lock`` holds; a failed publish frees the lock."""
    headers = dict(options.pop("headers", None) or {})
    headers[HEADER_KEY] = key
    try:
        return publish(args, kwargs, task_id=task_id, headers=headers, **options)
    except BaseException:
        try:
            lock.release()
        except Exception:  # the publish error is the one to report
            log.exception("could not release %s after a failed publish", key)
        raise


#: How often a coalesce/replace call tries again when the key changes hands under it.
_FOLLOW_TRIES = 8


def _follow(
    task: AnyTask, publish: Callable[..., AnyResult], locking: TaskLocking, key: str, *,
    task_id: str, args: Any, kwargs: Any, options: dict[str, Any],
) -> AnyResult:  # fmt: skip
    """A queue-scope call under coalesce or replace that found ``key`` held: it becomes the
    pending follow-up (every such call gets that one AsyncResult), or supersedes a queued
    holder (replace), or takes the key when it turned free meanwhile."""
    policy = locking.options.on_conflict
    for _ in range(_FOLLOW_TRIES):
        found = followup.call_or_follow(locking, task.app, key, task_id, args=args,
                                        kwargs=kwargs, options=options,
                                        replace=policy == "replace")  # fmt: skip
        if found.outcome == "follow":
            observe.conflict(task, key, None, policy=policy, scope="queue")
            observe.coalesced(task, key, str(found.task_id), scope="queue")
            log.info("%s[%s] not published: it is the follow-up %s of %s", task.name, task_id,
                     found.task_id, key)  # fmt: skip
            return task.AsyncResult(str(found.task_id))
        if found.outcome in ("superseded", "revoke"):
            old = str(found.task_id)
            if found.outcome == "revoke":
                task.app.control.revoke(old, terminate=True)
            _store_superseded(task, old, task_id)
            observe.conflict(task, key, None, policy="replace", scope="queue",
                             holder_task_id=old)  # fmt: skip
            observe.superseded(task, key, old, by=task_id, running=found.outcome == "revoke")
            log.info("%s[%s] supersedes %s (%s)", task.name, task_id, old, key)
            lock = locking.new_lock(task.app, key, task_id, queued=True)  # the script took it
            return _publish_locked(publish, lock, key, task_id=task_id, args=args,
                                   kwargs=kwargs, options=options)  # fmt: skip
        chosen = str(found.task_id) if found.outcome == "adopt" else task_id
        lock = locking.new_lock(task.app, key, chosen, queued=True)
        if lock.acquire(blocking=False):
            return _publish_locked(publish, lock, key, task_id=chosen, args=args, kwargs=kwargs,
                                   options=options)  # fmt: skip
    raise TaskLocked(key, None, f"lock {key!r} kept changing hands; {policy} gave up")


def _store_superseded(task: AnyTask, task_id: str, by: str) -> None:
    """Store REVOKED for a superseded task id (its message will end without running), so
    its AsyncResult is ready; nothing to store without a result backend."""
    try:
        task.backend.mark_as_revoked(task_id, reason=f"superseded by {by}")
    except Exception:  # a disabled or unreachable result backend: the log says it
        log.warning("could not store REVOKED for superseded task %s", task_id, exc_info=True)


def _publish_followup(task: AnyTask, key: str, takeover: followup.Takeover, limit: int) -> None:
    """Publish the follow-up that just took ``key`` over, past the lock; if that fails, free
    the key (the follow-up is lost, and logged)."""
    options: dict[str, Any] = {**takeover.options, REPUBLISH_OPTION: {HEADER_KEY: key}}
    try:
        task.apply_async(takeover.args, takeover.kwargs, task_id=takeover.task_id, **options)
    except Exception:
        log.exception("could not publish follow-up %s of %s; freeing the key", takeover.task_id,
                      key)  # fmt: skip
        locking = locking_for(task)
        if locking is not None:
            with contextlib.suppress(LockNotOwned):
                RedisLock(locking.client(task.app), key, token=queue_token(takeover.task_id, limit),
                          scripting=locking.settings.scripting).release()  # fmt: skip
        return
    log.info("%s[%s]: published as the follow-up of %s", task.name, takeover.task_id, key)

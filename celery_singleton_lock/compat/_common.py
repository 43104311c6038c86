"""What the two compat base classes share.

``CompatTask`` is a queue-scope ``LockedTask`` that hands its predecessor's options to the
runtime (through the runtime's adapt hook) and reports a duplicate call the way its
predecessor did. The lock itself is the runtime's: taken at publish, claimed by the run of
that message, released by its owner, handed over by the task's own retry. Two things are
added on top, for both predecessors' users: a task's own retry is never refused as a
duplicate (when the runtime cannot hand the lock over, because the retry changed the
arguments or the lock was given up before the run, the retried message is published past
the lock, and its run waits its turn); and ``task.apply()``, which publishes nothing, runs
the body without any lock, as both predecessors did (their locks were taken only in
``apply_async``), even while an identical message is queued. And a lock Redis that cannot
be reached at publish is a ``LockConnectionError``: our ``LockBackendError``, and also the
``redis.exceptions.ConnectionError`` that both predecessors let through.

The settings helpers read a predecessor's setting under every spelling its users write:
``singleton_key_prefix``, ``SINGLETON_KEY_PREFIX`` and ``CELERY_SINGLETON_KEY_PREFIX``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import redis
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock import runtime
from celery_singleton_lock.client import mask_url, url_error
from celery_singleton_lock.exceptions import LockBackendError, LockConnectionError, TaskLocked
from celery_singleton_lock.keys import check_lock_keys
from celery_singleton_lock.options import Settings, did_you_mean
from celery_singleton_lock.task import LockedTask

if TYPE_CHECKING:
    from celery.result import AsyncResult

__all__ = [
    "CompatTask",
    "applied_directly",
    "as_predecessor_error",
    "check_keys",
    "conf_value",
    "parse_setting",
    "redis_url",
    "setting_spellings",
    "unknown_names",
]


def setting_spellings(name: str) -> tuple[str, ...]:
    """The names a setting is written under: as documented, upper case (old-style Celery
    configuration) and with Django's ``CELERY_`` namespace."""
    return (name, name.upper(), f"CELERY_{name.upper()}")


def conf_value(conf: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    """``(name as written, value)`` of the first of ``names`` that ``conf`` sets to something
    other than None; ``(None, None)`` when none is set."""
    for name in names:
        if name in conf and conf[name] is not None:
            return name, conf[name]
    return None, None


def parse_setting(field: str, value: Any, where: str) -> Any:
    """``value`` checked and normalised by the parser of our own setting ``field`` (an
    ``ImproperlyConfigured`` naming ``where`` when it does not fit)."""
    row = next(row for row in dataclasses.fields(Settings) if row.name == field)
    parse: Callable[[Any, str], Any] = row.metadata["parse"]
    return parse(value, where)


def redis_url(value: Any, where: str) -> str:
    """A Redis URL the lock's client understands; ``ImproperlyConfigured`` naming ``where``
    (password masked) for anything else."""
    problem = url_error(value)
    if problem is not None:
        raise ImproperlyConfigured(f"{where}: {problem}, got {mask_url(value)!r}")
    return str(value)


def unknown_names(given: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """``ImproperlyConfigured`` with a suggestion for the first name of ``given`` that is not
    in ``known``: a typo in a dict of options must not pass silently."""
    for name in given:
        if name not in known:
            hint = did_you_mean(str(name), known)
            raise ImproperlyConfigured(f"{where}: unknown option {name!r} ({hint})")


def check_keys(task: Any, keys: tuple[str, ...], where: str) -> None:
    """``ImproperlyConfigured`` naming ``where`` when ``keys`` names no parameter of the
    task's body."""
    try:
        check_lock_keys(task.run, keys)
    except ValueError as exc:
        raise ImproperlyConfigured(f"task {task.name!r}: {where}: {exc}") from exc


def applied_directly(request: Any) -> bool:
    """Whether the run of ``request`` is ``task.apply()`` in this process: an eager run that
    no locked publish made. A publish that took the lock names its key in the message
    (also when ``task_always_eager`` runs it at once, and in the eager re-run of its
    retries); ``apply()`` carries no such header."""
    return (
        bool(getattr(request, "is_eager", False))
        and not getattr(request, "called_directly", True)
        and runtime.header_key(request) is None
    )


def as_predecessor_error(error: LockBackendError) -> LockBackendError:
    """``error`` as a predecessor's caller expects it: a ``LockConnectionError`` (also
    redis-py's ``ConnectionError``) when a redis-py ``ConnectionError`` is behind it, with
    the same message and lock name; else ``error`` itself."""
    if isinstance(error, LockConnectionError):
        return error
    seen: BaseException | None = error.__cause__
    for _ in range(5):  # a LockBackendError may wrap another one before redis-py's error
        if seen is None or isinstance(seen, redis.exceptions.ConnectionError):
            break
        seen = seen.__cause__
    if not isinstance(seen, redis.exceptions.ConnectionError):
        return error
    converted = LockConnectionError(error.message, error.name)
    converted.__cause__ = seen
    return converted


class CompatTask(LockedTask):
    """A queue-scope ``LockedTask`` driven by a predecessor's options and settings.

    A subclass says how its settings map onto ours (:meth:`compat_adapt`), which per-call
    option it takes (:attr:`compat_call_option`) and what a duplicate call returns or raises
    (:meth:`compat_duplicate`). Our own ``lock_*`` options still work on it and win over the
    mapped ones.
    """

    #: Task attributes of the predecessor whose names start with ``lock_`` (they are not
    #: ours, so they are not validated as ``lock_*`` options).
    compat_foreign_lock_names: ClassVar[frozenset[str]] = frozenset()
    #: The predecessor's option that chooses the key parameters, for error messages.
    compat_keys_option: ClassVar[str] = "lock_keys"
    #: The predecessor's per-call ``apply_async`` option (popped before publishing), if any.
    compat_call_option: ClassVar[str | None] = None

    def compat_adapt(self, settings: Settings) -> tuple[Settings, dict[str, Any]]:
        """The settings to lock with and the ``lock_*`` options the predecessor's options and
        settings map to; raises ``ImproperlyConfigured`` for a bad one."""
        raise NotImplementedError

    def compat_call_options(self, given: Any) -> dict[str, Any]:
        """The ``lock_*`` options (and runtime publish options) of one call that passed the
        predecessor's per-call option with value ``given``."""
        return {}

    def compat_duplicate(
        self, holder_id: str | None, key: str, result: AsyncResult[Any] | None, given: Any
    ) -> Any:
        """What a duplicate call returns (or raises): ``result`` is the holder's AsyncResult
        (None when the holder is not a task), ``given`` the per-call option's value."""
        raise NotImplementedError

    def singleton_lock_adapt(
        self, settings: Settings, own: dict[str, Any] | None
    ) -> tuple[Settings, dict[str, Any]]:
        """The runtime's adapt hook: the mapped options, with the task's own ``lock_*``
        options (those it set) laid over them."""
        adapted, mapped = self.compat_adapt(settings)
        given = {
            name: value
            for name, value in (own or {}).items()
            if name not in self.compat_foreign_lock_names
            and (value is not None or name == "lock_keys")
        }
        if "lock_keys" in given and "lock_keys" in mapped:
            raise ImproperlyConfigured(
                f"task {self.name!r}: {self.compat_keys_option} and lock_keys are both set; "
                "keep one"
            )
        return adapted, {**mapped, **given}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if applied_directly(self.request):
            # task.apply(): no lock (the predecessors locked only in apply_async). The next
            # __call__ past the locking classes runs the body (a base class's own, or
            # Celery's).
            return runtime.body_of(self, super(LockedTask, self).__call__)(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def apply_async(  # type: ignore[override]  # same call shape, options forwarded as-is
        self, args: Any = None, kwargs: Any = None, **options: Any
    ) -> Any:
        try:
            return self._compat_apply_async(args, kwargs, options)
        except LockBackendError as exc:
            converted = as_predecessor_error(exc)
            if converted is exc:
                raise
            raise converted from converted.__cause__

    def _compat_apply_async(self, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
        given = options.pop(self.compat_call_option, None) if self.compat_call_option else None
        celery_apply_async = super(LockedTask, self).apply_async
        published = False

        def publish(*publish_args: Any, **publish_options: Any) -> AsyncResult[Any]:
            nonlocal published
            published = True
            return celery_apply_async(*publish_args, **publish_options)

        merged = {**self.compat_call_options(given), **options}
        retry = bool(options.get("retries"))
        try:
            result = runtime.locked_apply_async(self, publish, args, kwargs, **merged)
        except TaskLocked as exc:
            if published:
                raise  # raised by an eager run of the body: the task's own outcome
            if retry:
                return _publish_past_lock(celery_apply_async, args, kwargs, options)
            return self.compat_duplicate(exc.task_id, exc.key, None, given)
        if published:
            return result
        if retry:
            # The task's own retry: never refused; its run waits for the holder.
            return _publish_past_lock(celery_apply_async, args, kwargs, options)
        locking = runtime.locking_for(self)
        key = locking.key(args, kwargs, serializer=options.get("serializer")) if locking else ""
        return self.compat_duplicate(result.id, key, result, given)


def _publish_past_lock(
    publish: Callable[..., Any], args: Any, kwargs: Any, options: dict[str, Any]
) -> Any:
    """Publish a retry without taking the lock. The headers it inherited from the run's
    message name that run's key: they go, so its own run locks what its arguments say."""
    headers = {
        name: value
        for name, value in (options.get("headers") or {}).items()
        if name not in (runtime.HEADER_KEY, runtime.HEADER_DUPLICATE)
    }
    return publish(args, kwargs, **{**options, "headers": headers})

"""How a task locks: its options resolved once per task and app, the key of a call, and the
lock object of a publish or of one delivery's run."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.exceptions import ImproperlyConfigured
from kombu.serialization import dumps, loads

from celery_singleton_lock._observe import RunLock
from celery_singleton_lock.client import LockClient, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine import RedisLock
from celery_singleton_lock.engine.stack import Stack
from celery_singleton_lock.key_builder import KeyBuilder, key_builder
from celery_singleton_lock.keys import check_lock_keys, signature_names
from celery_singleton_lock.modes import Plan, check_combinations, plan_for
from celery_singleton_lock.modes.scope import queue_token, task_group
from celery_singleton_lock.options import TASK_OPTION_PREFIX, LockOptions, Settings
from celery_singleton_lock.runtime.process import HOST, process_identity
from celery_singleton_lock.stacking import call_stack, check_limit_fields, stack_tag

if TYPE_CHECKING:
    from celery import Task

    AnyTask = Task[Any, Any]
else:
    AnyTask = Any

__all__ = [
    "ADAPT_HOOK",
    "FOREIGN_ALLOWED",
    "LOCKED_MARKER",
    "TaskLocking",
    "lock_key_method",
    "locking_for",
    "own_options",
    "wire_form",
]

#: Class attribute that marks a task class whose own ``lock_*`` attributes count.
LOCKED_MARKER = "__singleton_lock__"
#: Methods of locked tasks whose names look like options.
TASK_METHODS = frozenset({"lock_key", "lock_explain"})
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


@dataclass(frozen=True)
class TaskLocking:
    """Everything one task needs to lock its calls, resolved once per task and app."""

    task_name: str
    func: Callable[..., Any]
    settings: Settings
    options: LockOptions
    serializer: str = "json"

    @functools.cached_property
    def plan(self) -> Plan:
        """The policy, scope and modes these options select."""
        return plan_for(self.options)

    def key(
        self, args: Any, kwargs: Any, *, received: bool = False, serializer: str | None = None
    ) -> str:
        """The lock key of a call with these arguments. Unless they were ``received`` from a
        message, they are first put through the message serializer and back, so the
        producer computes the key from what the worker will see (a JSON round trip turns
        tuples into lists, int dict keys into strings, enums into their values)."""
        if not received:
            args, kwargs = wire_form(args, kwargs, serializer or self.serializer)
        return self._key_of(tuple(args or ()), dict(kwargs or {}))

    @functools.cached_property
    def _key_of(self) -> KeyBuilder:
        """The key of a call's (received) arguments, built for this task once."""
        tag = stack_tag(self.settings.prefix) if self.options.limits else None
        return key_builder(
            self.settings.prefix, self.task_name, self.func, self.options.keys, tag=tag
        )

    def stack(self, args: Any, kwargs: Any, *, received: bool = False) -> Stack | None:
        """The stacked limits a run of a call with these arguments takes a share of (None
        without ``lock_limits``); arguments not ``received`` from a message are first put
        through the serializer, as for the key. A weight callable that fails, or gives no
        whole number from 1 up, raises ``ValueError`` naming ``lock_weight``."""
        options = self.options
        if not options.limits:
            return None
        if not received:
            args, kwargs = wire_form(args, kwargs, self.serializer)
        return call_stack(
            self.settings.prefix,
            self.func,
            options.limits,
            options.weight,
            tuple(args or ()),
            dict(kwargs or {}),
        )

    def with_call_options(self, given: Mapping[str, Any]) -> TaskLocking:
        """This task's locking with the ``lock_*`` options of one call applied."""
        if not given:
            return self
        changes = {name.removeprefix(TASK_OPTION_PREFIX): value for name, value in given.items()}
        options = dataclasses.replace(self.options, **changes)
        check_combinations(options, f"task {self.task_name!r} with per-call options", self.settings)
        return dataclasses.replace(self, options=options)

    def _info(self, task_id: str, *, queued: bool = False) -> str:
        """The holder info of a lock of ``task_id`` (``queued``: taken at publish)."""
        info: dict[str, Any] = {
            "task_id": task_id,
            "task": self.task_name,
            "host": HOST,
            "pid": os.getpid(),
            "proc": process_identity(),
        }
        if queued:
            info["queued"] = True
        return json.dumps(info, sort_keys=True, separators=(",", ":"))

    def _fast_info(self, task_id: str, *, queued: bool = False) -> str:
        """``_info`` from a template of this process (worked out again in a forked child,
        whose pid differs): the JSON text around the task id is the same for every lock."""
        pid = os.getpid()
        parts = self.__dict__.get("_info_parts")
        if parts is None or parts[0] != pid:
            marker = "\x00task-id\x00"
            parts = self.__dict__["_info_parts"] = (
                pid,
                {
                    held: self._info(marker, queued=held).partition(json.dumps(marker))[::2]
                    for held in (False, True)
                },
            )
        before, after = parts[1][queued]
        return before + json.dumps(task_id) + after

    def owner(self, app: Any, key: str, token: str) -> RedisLock:
        """A lock of ``key`` that acts for the hold under owner ``token`` (to free or hand
        on a hold taken for a call, e.g. at its publish)."""
        return RedisLock(
            self.client(app),
            key,
            token=token,
            scripting=self.settings.scripting,
            limit=self.options.limit,
        )

    def client(self, app: Any) -> LockClient:
        """The lock Redis client of ``app`` in this process."""
        return redis_for(app, self.settings.url)

    def new_lock(
        self,
        app: Any,
        key: str,
        task_id: str,
        *,
        queued: bool = False,
        claim: str | None = None,
        stack: Stack | None = None,
    ) -> RunLock:
        """The lock of a publish (``queued``) or of one delivery's run of the task.

        A publish that locks holds it under a token derived from the task id; the delivery
        that runs the message claims that hold (the scope says which) under a token of its
        own, so a second delivery of the same message is a rival. ``claim`` overrides the
        token to take over. ``stack``: the stacked limits a run (not a publish) also takes
        a share of.
        """
        options = self.options
        if queued:
            holder_info = self._fast_info(task_id, queued=True)
        else:
            holder_info = self._fast_info(task_id)
            if claim is None and self.plan.claim:
                claim = next(
                    (token for mode in self.plan.claim if (token := mode.claim(task_id, options))),
                    None,
                )
        client = self.client(app)
        token = queue_token(task_id, options.limit) if queued else None
        unless_finished = task_id if not queued and self.plan.scope.drops_finished else None
        if options.limit > 1:  # each task's slots are its own group: no template
            return RunLock(
                client,
                key,
                **self._lock_arguments(queued),
                token=token,
                claim=claim,
                group=task_group(task_id),
                holder_info=holder_info,
                stack=None if queued else stack,
                unless_finished=unless_finished,
            )
        return self._template(client, queued).on_key(
            key,
            token=token,
            claim=claim,
            holder_info=holder_info,
            stack=None if queued else stack,
            unless_finished=unless_finished,
        )

    def _lock_arguments(self, queued: bool) -> dict[str, Any]:
        """The arguments of a publish's lock (``queued``) or a run's that are the same for
        every call of the task."""
        options = self.options
        return {
            "timeout": options.queue_timeout if queued else options.timeout,
            "auto_renew": options.renew and not queued,
            "scripting": self.settings.scripting,
            "limit": options.limit,
            "replicas": options.replicas,
            "fair_after": options.fair_after,
        }

    def _template(self, client: LockClient, queued: bool) -> RunLock:
        """The lock every publish's (``queued``) or run's lock of this task is built from
        (``RedisLock.on_key``): its arguments checked once per task and client."""
        templates: dict[bool, RunLock] = self.__dict__.setdefault("_templates", {})
        found = templates.get(queued)
        if found is None or found.client is not client:
            name = f"{self.settings.prefix}:{{template}}"
            found = templates[queued] = RunLock(client, name, **self._lock_arguments(queued))
        return found


_JSON_SCALARS = (str, int, bool, type(None))
#: Nesting deeper than this takes the serializer round trip (and its own limits).
_JSON_DEPTH = 32
_NOT_NATIVE = object()


def _as_json_reads(value: Any, depth: int = 0) -> Any:
    """``value`` as a JSON round trip gives it back (tuples become lists), or ``_NOT_NATIVE``
    when that is not plainly so (any other type, a non-finite float, a non-str dict key)."""
    kind = type(value)  # exact types: an IntEnum or a str Enum reads back as its value
    if kind in _JSON_SCALARS or (kind is float and math.isfinite(value)):
        return value  # a finite float's repr round-trips exactly
    if depth >= _JSON_DEPTH:
        return _NOT_NATIVE
    if kind in (list, tuple):
        items = [_as_json_reads(item, depth + 1) for item in value]
        return _NOT_NATIVE if any(item is _NOT_NATIVE for item in items) else items
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                return _NOT_NATIVE
            out[key] = converted = _as_json_reads(item, depth + 1)
            if converted is _NOT_NATIVE:
                return _NOT_NATIVE
        return out
    return _NOT_NATIVE


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
        check_combinations(options, f"task {task.name!r}", effective)
        try:
            check_lock_keys(task.run, options.keys)
        except ValueError as exc:
            raise ImproperlyConfigured(f"lock_keys of task {task.name!r}: {exc}") from exc
        try:
            check_limit_fields(task.run, options.limits, signature_names(task.run))
        except ValueError as exc:
            raise ImproperlyConfigured(f"lock_limits of task {task.name!r}: {exc}") from exc
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

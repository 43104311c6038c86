"""The one table of lock options and settings: every name, default, check and doc line.

Each option is one dataclass field carrying its parser and its documentation; everything else
is derived from these two classes: task attributes (``lock_<name>``), per-call overrides
through ``apply_async``, ``singleton_lock_tasks`` entries, the ``singleton_lock_<name>``
settings and their Django spellings, validation with "did you mean" for unknown names, and the
configuration reference in the docs (:func:`reference_markdown`). Adding an option is one field
here plus its behaviour.

``LockOptions`` holds what a task may set for itself; ``Settings`` adds what only the app can
set and doubles as the app-wide defaults of every ``LockOptions`` field.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import math
import numbers
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.client import REDIS_URL_SCHEMES, mask_url, url_error
from celery_singleton_lock.engine.constants import MAX_DURATION
from celery_singleton_lock.stacking import MAX_WEIGHT, LimitsOption, WeightOption, parse_limits

__all__ = [
    "CONFLICT_POLICIES",
    "MAX_DURATION",
    "MAX_RATE_STARTS",
    "MIN_TIMEOUT",
    "ON_LOST",
    "OPTION_RULES",
    "ORDERS",
    "RATE_UNITS",
    "RELEASES",
    "SCOPES",
    "SETTING_PREFIX",
    "TASK_OPTION_PREFIX",
    "Combination",
    "LockOptions",
    "Settings",
    "did_you_mean",
    "no_scripts",
    "parse_rate",
    "reference_markdown",
    "setting_names",
    "task_option_names",
    "validate_task_options",
]

CONFLICT_POLICIES = ("skip", "wait", "retry", "raise", "coalesce", "replace", "park")
SCOPES = ("run", "queue")
#: What a run learns when its lease is lost while the body runs.
ON_LOST = ("warn", "raise")
#: In which order the calls of one key run: as their messages arrive, or as they were made.
ORDERS = ("arrival", "enqueue")
#: When a run's key frees: at the end of the run, when the body starts (queue scope), or at
#: the end unless the run succeeded, which keeps it ``lock_hold`` seconds more.
RELEASES = ("end", "start", "success")
#: ``lock_rate_limit`` units, as in Celery's rate strings: seconds per unit.
RATE_UNITS = {"s": 1, "m": 60, "h": 3600}
#: The most starts a rate may allow per window: each one is a member of a sorted set.
MAX_RATE_STARTS = 100_000
#: Task attributes, per-call options and ``singleton_lock_tasks`` entries start with this.
TASK_OPTION_PREFIX = "lock_"
#: Every app setting starts with this (Django: ``CELERY_`` + the upper-case name).
SETTING_PREFIX = "singleton_lock_"
#: The shortest lease, in seconds: a shorter one would renew many times a second.
MIN_TIMEOUT = 0.5
# MAX_DURATION, the longest duration in seconds every option and setting accepts
# (31,536,000 s, 365 days), is defined by the engine, which bounds leases by it too and
# cannot import this module: a lock value's expiry must stay below 2**53 ms.
#: How the bound reads in the reference table and in error messages.
_UP_TO = f"<= {MAX_DURATION} (365 days)"

KeysOption = tuple[str, ...] | Callable[[tuple[Any, ...], dict[str, Any]], Any] | None
Parser = Callable[[Any, str], Any]


# ----------------------------------------------------------------------- parsers
# Each takes (value, where) and returns the normalised value or raises
# ImproperlyConfigured whose message starts with ``where`` (the name as the user wrote it).


def _is_number(value: object) -> bool:
    """A real number that is not a bool (``True`` is an int, but never a duration)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _seconds(*, minimum: float, inclusive: bool, inf_is_none: bool = False) -> Parser:
    """A finite number of seconds above ``minimum`` and at most ``MAX_DURATION``;
    ``math.inf`` as None where allowed."""

    def parse(value: Any, where: str) -> float | None:
        if _is_number(value):
            try:
                number = float(value)
            except OverflowError:  # an int or Fraction too big for a float
                number = math.nan
            if inf_is_none and number == math.inf:
                return None
            above = number >= minimum if inclusive else number > minimum
            if math.isfinite(number) and above and number <= MAX_DURATION:
                return number
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        forever = " (None or math.inf: forever)" if inf_is_none else ""
        raise ImproperlyConfigured(
            f"{where} must be a finite number of seconds {bound} and {_UP_TO}{forever}, "
            f"got {value!r}"
        )

    return parse


#: Redis WAIT takes its number of replicas as a signed 64-bit integer.
_MAX_REPLICAS = 2**63 - 1


def _replica_count(value: Any, where: str) -> int:
    """A whole number from 0 to what Redis accepts (not a bool)."""
    if (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and 0 <= int(value) <= _MAX_REPLICAS
    ):
        return int(value)
    raise ImproperlyConfigured(f"{where} must be an integer >= 0, got {value!r}")


def _flag(value: Any, where: str) -> bool:
    """A real bool: strings like ``"false"`` are truthy, so they are refused."""
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")


def _choice(choices: tuple[str, ...]) -> Parser:
    def parse(value: Any, where: str) -> str:
        if isinstance(value, str) and value in choices:
            return value
        allowed = ", ".join(repr(choice) for choice in choices)
        raise ImproperlyConfigured(f"{where} must be one of {allowed}, got {value!r}")

    return parse


def _count(*, minimum: int) -> Parser:
    """A whole number (not a bool) of at least ``minimum``."""

    def parse(value: Any, where: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        raise ImproperlyConfigured(f"{where} must be a whole number >= {minimum}, got {value!r}")

    return parse


def _keys(value: Any, where: str) -> KeysOption:
    """``None``, a callable, or a list/tuple of parameter names (returned as a tuple).

    Whether the names exist is checked against the task's signature by the task layer,
    which knows the function.
    """
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
        return tuple(value)
    hint = " (wrap a single name in a list: ['name'])" if isinstance(value, str) else ""
    raise ImproperlyConfigured(
        f"{where} must be None, a callable (args, kwargs) -> str, or a list/tuple of "
        f"parameter names, got {value!r}{hint}"
    )


def _slots(value: Any, where: str) -> int:
    """``lock_limit``: a whole number >= 1; a list of pairs was meant for ``lock_limits``."""
    if isinstance(value, (list, tuple)):
        raise ImproperlyConfigured(
            f"{where} must be a whole number >= 1 (slots per key), got {value!r}; stacked "
            "limits of (template, N) pairs are lock_limits"
        )
    return _count(minimum=1)(value, where)  # type: ignore[no-any-return]


def _limits(value: Any, where: str) -> LimitsOption:
    """``lock_limits``: a list of ``(template, N)`` pairs (returned as a tuple of tuples);
    the templates' names are checked against the task's signature by the task layer."""
    try:
        return parse_limits(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from None


def _weight(value: Any, where: str) -> WeightOption:
    """``lock_weight``: a whole number from 1 to ``MAX_WEIGHT``, or a callable of the bound
    arguments (as keyword arguments) that returns one."""
    if callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WEIGHT:
        return value
    raise ImproperlyConfigured(
        f"{where} must be a whole number from 1 to {MAX_WEIGHT} or a callable of the bound "
        f"arguments, got {value!r}"
    )


_RATE = re.compile(r"([0-9]{1,9})(?:/([smh]))?")


def _rate(value: Any, where: str) -> str:
    """Celery's rate string, strictly: ``"N/s"``, ``"N/m"``, ``"N/h"`` or a bare ``N`` (per
    second, as Celery reads it; also as an int), N a whole number of starts from 1 to
    ``MAX_RATE_STARTS``. Returned in the canonical form ``"N/unit"``."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    found = _RATE.fullmatch(text) if isinstance(text, str) else None
    if found and 1 <= int(found.group(1)) <= MAX_RATE_STARTS:
        return f"{int(found.group(1))}/{found.group(2) or 's'}"
    raise ImproperlyConfigured(
        f"{where} must be a rate 'N/s', 'N/m' or 'N/h' (at most N starts per key in any "
        f"second, minute or hour; a bare N is per second), N a whole number from 1 to "
        f"{MAX_RATE_STARTS}, got {value!r}"
    )


def parse_rate(rate: str) -> tuple[int, int]:
    """``(N, window ms)`` of a validated ``lock_rate_limit`` (``"10/m"`` -> ``(10, 60000)``)."""
    count, _, unit = _rate(rate, "lock_rate_limit").partition("/")
    return int(count), RATE_UNITS[unit] * 1000


def _url(value: Any, where: str) -> str | None:
    """A Redis URL whose scheme the lock's client understands; None: derive it."""
    if value is None:
        return None
    problem = url_error(value)
    if problem is None:
        return str(value)
    raise ImproperlyConfigured(f"{where}: {problem}, got {mask_url(value)!r}")


def _prefix(value: Any, where: str) -> str:
    """A non-empty key prefix without braces (a brace would move the Cluster hash tag),
    whitespace or unprintable characters."""
    if (
        isinstance(value, str)
        and value
        and not any(ch in "{}" or ch.isspace() or not ch.isprintable() for ch in value)
    ):
        return value
    raise ImproperlyConfigured(
        f"{where} must be a non-empty string without braces or whitespace, got {value!r}"
    )


def _tasks(value: Any, where: str) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """``{glob: {lock_*: value}}`` (or a list of ``(glob, options)`` pairs), in order."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in value
    ):
        pairs = [(pair[0], pair[1]) for pair in value]
    else:
        raise ImproperlyConfigured(
            f"{where} must be a mapping of task-name glob to options, "
            f'e.g. {{"billing.*": {{"lock_keys": ["invoice_id"]}}}}, got {value!r}'
        )
    result: list[tuple[str, Mapping[str, Any]]] = []
    for pattern, options in pairs:
        if not isinstance(pattern, str) or not pattern:
            raise ImproperlyConfigured(
                f"{where}: keys must be task-name globs (non-empty str), got {pattern!r}"
            )
        label = f"{where}[{pattern!r}]"
        result.append((pattern, MappingProxyType(validate_task_options(options, label))))
    return tuple(result)


# ------------------------------------------------------------------------- table


def _option(
    default: Any,
    parse: Parser,
    doc: str,
    *,
    values: str,
    setting: bool = True,
    none_is_value: bool = False,
) -> Any:
    """One row of the table. ``setting``: also an app-wide ``singleton_lock_*`` setting.
    ``none_is_value``: None is a real value (else, on a task, it means "not set")."""
    return field(
        default=default,
        metadata={
            "parse": parse,
            "doc": doc,
            "values": values,
            "setting": setting,
            "none_is_value": none_is_value,
        },
    )


@dataclass(frozen=True)
class LockOptions:
    """The effective lock options of one task: its own attributes, else the first matching
    ``singleton_lock_tasks`` glob, else the app's settings."""

    keys: KeysOption = _option(
        None, _keys,
        "What identifies \"the same work\": None = every argument (bound to the signature), "
        "a list of parameter names, () = the task name only, or a callable (args, kwargs) -> str.",
        values="None, list of names, (), callable", setting=False, none_is_value=True,
    )  # fmt: skip
    timeout: float = _option(
        30.0, _seconds(minimum=MIN_TIMEOUT, inclusive=True),
        "The lease in seconds; renewed while the body runs, so a crashed worker's lock frees "
        "within one lease.",
        values=f"seconds >= {MIN_TIMEOUT:g}, {_UP_TO}",
    )  # fmt: skip
    renew: bool = _option(
        True, _flag, "Keep extending the lease while the body runs.", values="True, False"
    )
    on_conflict: str = _option(
        "skip", _choice(CONFLICT_POLICIES),
        "What a run does when another holds the lock: skip it, wait (at most lock_wait), "
        "retry after lock_retry_delay, raise TaskLocked, or park (the call waits in the key's "
        "queue in the lock Redis, holding no worker, and is published again when the key is "
        "handed to it). Queue scope also: coalesce (the call becomes the one pending "
        "follow-up, latest arguments win) or replace (the call supersedes a queued holder, "
        "else follows a running one).",
        values=", ".join(CONFLICT_POLICIES),
    )  # fmt: skip
    scope: str = _option(
        "run", _choice(SCOPES),
        "run: held while the body executes; queue: taken at apply_async and held until that "
        "run ends, so a duplicate call publishes nothing.",
        values=", ".join(SCOPES),
    )  # fmt: skip
    wait: float | None = _option(
        60.0, _seconds(minimum=0, inclusive=True, inf_is_none=True),
        "Longest wait of the wait policy before TaskLocked; None or math.inf waits forever.",
        values=f"seconds >= 0, {_UP_TO}; None, math.inf", none_is_value=True,
    )  # fmt: skip
    retry_delay: float | None = _option(
        None, _seconds(minimum=0, inclusive=True),
        "Countdown of the retry policy; None: 1 s doubling with each retry (plus jitter), "
        "never past the holder's remaining lease.",
        values=f"seconds >= 0, {_UP_TO}; None", none_is_value=True,
    )  # fmt: skip
    fair_after: float | None = _option(
        None, _seconds(minimum=0, inclusive=False),
        "Eventual fairness for waiting runs: a release lets a newcomer take the key while "
        "the first waiter has waited less than this many seconds, and hands the key to that "
        "waiter after. None: first come, first served.",
        values=f"seconds > 0, {_UP_TO}; None", none_is_value=True,
    )  # fmt: skip
    limit: int = _option(
        1, _slots,
        "Up to this many runs per key at once (slots, each leased, owner-checked and fenced "
        "like the lock); 1: one at a time. A task's deliveries never hold two slots.",
        values="whole number >= 1",
    )  # fmt: skip
    limits: LimitsOption = _option(
        (), _limits,
        "Stacked limits every run must also fit in, beside its key's: (template, N) pairs, "
        "a template over the task's parameters (\"tenant:{tenant_id}\") or a fixed name "
        "for a budget shared by all (\"global:exports\"). A run takes a share of each, of "
        "its lock_weight, in one step with its key, or waits as for a held key. N may be "
        "changed while workers run: celery locks limit set NAME N.",
        values="list of (template, whole number >= 0)", setting=False,
    )  # fmt: skip
    weight: WeightOption = _option(
        1, _weight,
        "With lock_limits: how much of each limit a run takes; a number, or a callable "
        "called with the bound arguments as keywords that returns one.",
        values=f"whole number 1..{MAX_WEIGHT}, callable", setting=False,
    )  # fmt: skip
    debounce: float | None = _option(
        None, _seconds(minimum=0, inclusive=False),
        "Calls of one key closer than this many seconds apart form a burst that runs once, "
        "this long after its last call, with the last call's arguments; every call of the "
        "burst gets the same AsyncResult. None: no debounce.",
        values=f"seconds > 0, {_UP_TO}; None", none_is_value=True,
    )  # fmt: skip
    debounce_max_wait: float | None = _option(
        None, _seconds(minimum=0, inclusive=False),
        "With lock_debounce: a burst runs at the latest this many seconds after its first "
        "call, however steady the stream of calls. None: no limit.",
        values=f"seconds > 0, {_UP_TO}; None", none_is_value=True,
    )  # fmt: skip
    replace_running: bool = _option(
        False, _flag,
        "With lock_on_conflict='replace': also supersede a holder that already runs: it is "
        "revoked with terminate=True and the new call, its follow-up, gets the key (a larger "
        "fencing token) as soon as that run has stopped. Needs a pool that can stop a run.",
        values="True, False",
    )  # fmt: skip
    queue_timeout: float = _option(
        3600.0, _seconds(minimum=MIN_TIMEOUT, inclusive=True),
        "Queue scope: the lease of the lock while its message waits in the queue (nobody "
        "renews it there).",
        values=f"seconds >= {MIN_TIMEOUT:g}, {_UP_TO}",
    )  # fmt: skip
    rate_limit: str | None = _option(
        None, _rate,
        "Cluster-wide throttle: at most N starts per key in any window of the given length "
        "(sliding, on the Redis clock); a run over it meets lock_on_conflict, retry counting "
        "down to the next free start. See Modes.",
        values="'N/s', 'N/m', 'N/h', N", setting=False,
    )  # fmt: skip
    release: str = _option(
        "end", _choice(RELEASES),
        "When the key frees: end of the run; start: when the body starts (queue scope only); "
        "success: at the end, but a successful run keeps it lock_hold seconds more.",
        values=", ".join(RELEASES), setting=False,
    )  # fmt: skip
    hold: float | None = _option(
        None, _seconds(minimum=0, inclusive=False),
        "With lock_release='success': seconds a successful run keeps the key after it "
        "ended (at most one success per lock_hold).",
        values=f"seconds > 0, {_UP_TO}", setting=False,
    )  # fmt: skip
    on_lost: str = _option(
        "warn", _choice(ON_LOST),
        "A lease lost while the body runs (a frozen worker, a partition): warn logs it and "
        "sends lock_lost; raise also raises LockLost inside the body as soon as the loss is "
        "known (as Celery raises SoftTimeLimitExceeded), so the work stops.",
        values=", ".join(ON_LOST),
    )  # fmt: skip
    order: str = _option(
        "arrival", _choice(ORDERS),
        "With lock_on_conflict='park': arrival runs a key's calls as their messages come; "
        "enqueue runs them in the order of their apply_async (higher priority first), a "
        "message delivered ahead of its turn parks, and a call with a countdown or ETA "
        "takes its turn when its time comes.",
        values=", ".join(ORDERS),
    )  # fmt: skip
    replicas: int = _option(
        0, _replica_count,
        "After taking or renewing a lock, wait (Redis WAIT, at most 0.5 s) until this many "
        "replicas have it; fewer in time: the lock is given back and the run retries as when "
        "Redis is unreachable. Narrows the window in which a failover loses a lock.",
        values="integer >= 0",
    )  # fmt: skip


@dataclass(frozen=True)
class Settings(LockOptions):
    """Every ``singleton_lock_*`` setting of one app, validated: the app-only settings below,
    and the defaults of every :class:`LockOptions` field inherited above.

    ``tasks`` keeps the ``singleton_lock_tasks`` entries in the user's order as ``(glob,
    validated options)``; the first glob matching a task name applies.
    """

    url: str = _option(
        "redis://localhost:6379/0", _url,
        "The lock Redis. Default: the broker URL if it is redis/rediss, else the result "
        "backend's if Redis, else redis://localhost:6379/0.",
        values=", ".join(f"{scheme}://" for scheme in REDIS_URL_SCHEMES) + " URL",
        none_is_value=True,
    )  # fmt: skip
    prefix: str = _option(
        "csl", _prefix, "Prefix of every lock key: prefix:task name:{digest}.",
        values="string without braces or whitespace",
    )  # fmt: skip
    tasks: tuple[tuple[str, Mapping[str, Any]], ...] = _option(
        (), _tasks,
        "Locks tasks that do not use base=LockedTask: a mapping of task-name glob to lock_* "
        "options, e.g. {\"billing.*\": {\"lock_keys\": [\"invoice_id\"]}}.",
        values="mapping of glob -> options",
    )  # fmt: skip
    fail_open: bool = _option(
        False, _flag,
        "With the lock Redis unreachable: False retries the task later (never runs it "
        "unlocked); True runs it unlocked and logs loudly.",
        values="True, False",
    )  # fmt: skip
    scripting: bool = _option(
        True, _flag,
        "False uses plain SETNX/GET/GETSET commands instead of Lua scripts (servers where "
        "EVAL is disabled).",
        values="True, False",
    )  # fmt: skip
    #: Where ``url`` came from: the setting's name as written, ``broker_url``,
    #: ``result_backend`` or ``default`` (logged at worker start).
    url_origin: str = field(default="default", compare=False)
    _matches: dict[str, int | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def task_defaults(self) -> LockOptions:
        """The :class:`LockOptions` part of these settings."""
        return LockOptions(**{f.name: getattr(self, f.name) for f in _fields(LockOptions)})

    def _matching(self, task_name: str) -> Mapping[str, Any] | None:
        """The options of the first ``tasks`` glob matching ``task_name`` (memoised)."""
        if not self.tasks:
            return None
        try:
            index = self._matches[task_name]
        except KeyError:
            index = next(
                (
                    position
                    for position, (pattern, _) in enumerate(self.tasks)
                    if fnmatch.fnmatchcase(task_name, pattern)
                ),
                None,
            )
            self._matches[task_name] = index
        return None if index is None else self.tasks[index][1]

    def locks_task(self, task_name: str) -> bool:
        """Whether a ``singleton_lock_tasks`` glob matches ``task_name``."""
        return self._matching(task_name) is not None

    def options_for(
        self, task_name: str, overrides: Mapping[str, Any] | None
    ) -> LockOptions | None:
        """The effective options of one task, or None when it is not locked at all.

        ``overrides`` are the task's own ``lock_*`` attributes (None for a task that is not a
        ``LockedTask``); a None value counts as unset except for ``lock_keys``, which the
        caller passes only when set. Precedence: overrides, then the first matching
        ``singleton_lock_tasks`` glob, then these settings.
        """
        matched = self._matching(task_name)
        if overrides is None and matched is None:
            return None
        merged: dict[str, Any] = dict(matched or {})
        if overrides:
            given = {
                name: value
                for name, value in overrides.items()
                if value is not None or name == "lock_keys"
            }
            merged.update(validate_task_options(given, f"task {task_name!r}"))
        defaults = self.task_defaults()
        return dataclasses.replace(
            defaults, **{name.removeprefix(TASK_OPTION_PREFIX): v for name, v in merged.items()}
        )


def _fields(cls: type[LockOptions]) -> Iterator[dataclasses.Field[Any]]:
    """The table rows of ``cls`` (private bookkeeping fields have no parser)."""
    return (f for f in dataclasses.fields(cls) if "parse" in f.metadata)


def task_option_names() -> tuple[str, ...]:
    """``lock_keys``, ``lock_timeout``, … : the names a task, a call or a glob entry may set."""
    return tuple(TASK_OPTION_PREFIX + f.name for f in _fields(LockOptions))


def setting_names() -> tuple[str, ...]:
    """``singleton_lock_url``, … : every app setting, in table order."""
    return tuple(SETTING_PREFIX + f.name for f in _fields(Settings) if f.metadata["setting"])


def setting_fields() -> Iterator[dataclasses.Field[Any]]:
    """The fields of :class:`Settings` that are app settings."""
    return (f for f in _fields(Settings) if f.metadata["setting"])


def did_you_mean(name: str, known: tuple[str, ...]) -> str:
    """``"did you mean 'x'?"`` for the closest known name, else the list of known names."""
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(known)


def validate_task_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate ``lock_*`` options (of a task, a call or a glob entry); return them normalised.

    ``where`` prefixes every message, e.g. ``"singleton_lock_tasks['billing.*']"``. An unknown
    name (a typo such as ``lock_timout``) is an error with a suggestion. None means "not set"
    (dropped from the result) except where it is a value of its own (``lock_keys``: every
    argument; ``lock_wait``: forever; ``lock_retry_delay``: automatic).
    """
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a mapping of lock_* options, got {options!r}")
    rows = {TASK_OPTION_PREFIX + f.name: f for f in _fields(LockOptions)}
    result: dict[str, Any] = {}
    for name, value in options.items():
        row = rows.get(name)
        if row is None:
            hint = did_you_mean(str(name), tuple(rows))
            raise ImproperlyConfigured(f"{where}: unknown option {name!r} ({hint})")
        if value is None:
            if row.metadata["none_is_value"]:
                result[name] = None
            continue
        result[name] = row.metadata["parse"](value, f"{where}: {name}")
    return result


# ------------------------------------------------------------------ combinations


@dataclass(frozen=True)
class Combination:
    """One rule about options that cannot go together. ``invalid(options, settings)`` says
    whether the effective options of a task (with the app's settings, when known) break
    it; ``message`` says why, naming every option involved as a user writes it."""

    invalid: Callable[[LockOptions, Settings | None], bool]
    message: str


def no_scripts(settings: Settings | None) -> bool:
    """Whether the app turned Lua scripts off (``singleton_lock_scripting=False``)."""
    return settings is not None and not settings.scripting


#: The rules about options that no mode owns; each mode states its own (``modes``
#: gathers them all and checks them for the effective options of each task and call).
OPTION_RULES: tuple[Combination, ...] = (
    Combination(
        lambda o, s: o.limit > 1 and no_scripts(s),
        "lock_limit > 1 needs Lua scripts (slots are taken by a script), which "
        "singleton_lock_scripting=False turns off",
    ),
    Combination(
        lambda o, s: bool(o.limits) and no_scripts(s),
        "lock_limits needs Lua scripts (a run's shares are taken by a script), which "
        "singleton_lock_scripting=False turns off",
    ),
    Combination(
        lambda o, s: not o.limits and o.weight != 1,
        "lock_weight needs lock_limits (the weight is what a run takes of each limit)",
    ),
    Combination(
        lambda o, s: bool(o.limits) and o.order == "enqueue",
        "lock_limits does not work with lock_order='enqueue' yet",
    ),
    Combination(
        lambda o, s: bool(o.limits) and o.release != "end",
        "lock_limits works with lock_release='end' only so far",
    ),
    Combination(
        lambda o, s: o.fair_after is not None and no_scripts(s),
        "lock_fair_after needs Lua scripts (the hand-off is done by a script), which "
        "singleton_lock_scripting=False turns off",
    ),
)


def reference_markdown() -> str:
    """The configuration reference table of the docs, generated from this table."""
    lines = [
        "| task option | setting | default | values | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in _fields(Settings):
        task_name = f"`{TASK_OPTION_PREFIX}{row.name}`" if row.name in _names(LockOptions) else "—"
        setting = f"`{SETTING_PREFIX}{row.name}`" if row.metadata["setting"] else "—"
        default = row.default if row.default is not dataclasses.MISSING else None
        shown = {"url": "derived", "tasks": "`{}`"}.get(row.name, f"`{default!r}`")
        doc = row.metadata["doc"].replace("|", "\\|")
        lines.append(f"| {task_name} | {setting} | {shown} | {row.metadata['values']} | {doc} |")
    return "\n".join(lines) + "\n"


def _names(cls: type[LockOptions]) -> set[str]:
    return {f.name for f in _fields(cls)}

"""The ``singleton_beat_*`` settings of a beat group: one table, read and validated once at
beat start, refusing unknown names with a suggestion (as ``singleton_lock_*`` are).

The lock Redis and the key prefix are the app's lock settings (``singleton_lock_url``,
``singleton_lock_prefix``); what is read here is only what beat replicas need besides.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.beat import Scheduler
from celery.exceptions import ImproperlyConfigured
from celery.utils.imports import load_extension_class_names, symbol_by_name

from celery_singleton_lock.config import written_settings
from celery_singleton_lock.engine.constants import MAX_DURATION
from celery_singleton_lock.options import did_you_mean

__all__ = [
    "BEAT_PREFIX",
    "CATCH_UP",
    "CATCH_UP_OPTION",
    "DEFAULT_SCHEDULER",
    "MIN_LEASE",
    "BeatSettings",
    "check_loop_interval",
    "entry_catch_up",
    "read_beat_settings",
    "reference_markdown",
]

#: Every beat setting starts with this (Django: ``CELERY_SINGLETON_BEAT_...``).
BEAT_PREFIX = "singleton_beat_"
#: What a new leader does with the slots that came due while nobody led: send the most
#: recent of them once, or skip them all and wait for the next slot.
CATCH_UP = ("once", "skip")
#: The key of a schedule entry's ``options`` that sets its own catch-up rule (taken out
#: of the options before the task is published).
CATCH_UP_OPTION = "catch_up"
DEFAULT_SCHEDULER = "celery.beat:PersistentScheduler"
#: The shortest lease, in seconds: the leader renews it a few times per lease.
MIN_LEASE = 1.0
_NAME = re.compile(r"[^\s{}]+")


def _scheduler_setting(value: Any, where: str) -> Any:
    """The setting as given (a name or a class), once it is known to import as a scheduler
    class that is not ``LeaderScheduler`` itself."""
    _scheduler(value, where)
    return value


def _scheduler(value: Any, where: str) -> type[Scheduler]:
    """A scheduler class, or its name as ``module:Class``, a dotted path or an alias of
    the ``celery.beat_schedulers`` entry points (``django``, ...)."""
    if isinstance(value, type):
        found: Any = value
    elif isinstance(value, str) and value.strip():
        aliases: dict[str, str] = dict(load_extension_class_names("celery.beat_schedulers"))  # type: ignore[arg-type]
        try:
            found = symbol_by_name(value.strip(), aliases=aliases)
        except Exception as exc:  # noqa: BLE001 - any import error is the setting's fault
            raise ImproperlyConfigured(
                f"{where}: cannot import the scheduler class {value!r} "
                f"({type(exc).__name__}: {exc}); write it as 'module:Class', e.g. "
                f"{DEFAULT_SCHEDULER!r}"
            ) from None
    else:
        raise ImproperlyConfigured(
            f"{where} must be a scheduler class or its name as 'module:Class', got {value!r}"
        )
    if not (isinstance(found, type) and issubclass(found, Scheduler)):
        raise ImproperlyConfigured(
            f"{where}: {value!r} is not a celery.beat.Scheduler subclass, got {found!r}"
        )
    if getattr(found, "wraps_scheduler", False):
        raise ImproperlyConfigured(
            f"{where}: {value!r} is the leader scheduler itself; name the scheduler it wraps "
            f"(default {DEFAULT_SCHEDULER!r})"
        )
    return found


def _lease(value: Any, where: str) -> float:
    """Seconds, a finite number from ``MIN_LEASE`` to ``MAX_DURATION``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and MIN_LEASE <= number <= MAX_DURATION:
            return number
    raise ImproperlyConfigured(
        f"{where} must be a number of seconds from {MIN_LEASE:g} to {MAX_DURATION}, got {value!r}"
    )


def _catch_up(value: Any, where: str) -> str:
    if isinstance(value, str) and value in CATCH_UP:
        return value
    allowed = ", ".join(repr(choice) for choice in CATCH_UP)
    raise ImproperlyConfigured(f"{where} must be one of {allowed}, got {value!r}")


def _name(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, str) and _NAME.fullmatch(value)):
        return value
    raise ImproperlyConfigured(
        f"{where} must be a non-empty name without braces or whitespace, got {value!r}"
    )


def _row(default: Any, parse: Any, doc: str, values: str) -> Any:
    return field(default=default, metadata={"parse": parse, "doc": doc, "values": values})


@dataclass(frozen=True)
class BeatSettings:
    """The validated ``singleton_beat_*`` settings of one app."""

    scheduler: str = _row(
        DEFAULT_SCHEDULER, _scheduler_setting,
        "The scheduler class LeaderScheduler wraps: it keeps the schedule (its entries, "
        "their changes, their persistence); the leader decides which slot is due and sends it.",
        "'module:Class', a dotted path, an alias such as 'django', or the class",
    )  # fmt: skip
    lease: float = _row(
        10.0, _lease,
        "Seconds the leader's lease lasts: a leader that is killed, frozen or cut off is "
        "replaced about this long after its last renewal. Must be longer than the beat loop "
        "interval (beat_max_loop_interval, --max-interval).",
        f"seconds, {MIN_LEASE:g} to {MAX_DURATION}",
    )  # fmt: skip
    catch_up: str = _row(
        "once", _catch_up,
        "What a new leader does with the slots of an entry that came due while nobody led: "
        "once sends the most recent of them once (never a burst), skip sends none and waits "
        "for the next slot. An entry's options={'catch_up': ...} overrides it.",
        ", ".join(CATCH_UP),
    )  # fmt: skip
    name: str | None = _row(
        None, _name,
        "The beat group: replicas with the same name and lock Redis elect one leader. "
        "None: the app's main name (Celery('proj') gives 'proj').",
        "name without braces or whitespace; None",
    )  # fmt: skip

    @property
    def scheduler_cls(self) -> type[Scheduler]:
        """The wrapped scheduler class, imported."""
        found: type[Scheduler] = _scheduler(self.scheduler, BEAT_PREFIX + "scheduler")
        return found


def _rows() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(BeatSettings))


def setting_names() -> tuple[str, ...]:
    """``singleton_beat_scheduler``, ...: every beat setting, in table order."""
    return tuple(BEAT_PREFIX + row.name for row in _rows())


def _written(conf: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """Every beat setting in ``conf``: canonical name -> (name as written, value), under any
    spelling (``singleton_beat_x``, ``SINGLETON_BEAT_X``, ``CELERY_SINGLETON_BEAT_X`` or the
    configured namespace's prefix); the lowercase spelling wins when written twice."""
    return written_settings(conf, BEAT_PREFIX)


def read_beat_settings(conf: Mapping[str, Any]) -> BeatSettings:
    """Read and validate the beat settings of ``app.conf`` (any mapping); the wrapped
    scheduler class is imported here. ``ImproperlyConfigured`` names the first bad or
    unknown setting as written."""
    written = _written(conf)
    known = setting_names()
    for canonical, (spelled, _) in written.items():
        if canonical not in known:
            raise ImproperlyConfigured(
                f"{spelled}: unknown setting ({did_you_mean(canonical, known)})"
            )
    values: dict[str, Any] = {}
    for row in _rows():
        entry = written.get(BEAT_PREFIX + row.name)
        if entry is not None and not (entry[1] is None and row.name == "name"):
            values[row.name] = row.metadata["parse"](entry[1], entry[0])
    settings = BeatSettings(**values)
    settings.scheduler_cls  # noqa: B018 - the default, too, must import
    return settings


def check_loop_interval(lease: float, interval: float | None) -> None:
    """Refuse a lease that is not longer than the beat loop interval the user configured
    (``beat_max_loop_interval`` or ``--max-interval``): a leader may sleep that long between
    ticks, so it would lose its lease while it sleeps."""
    if interval is None:
        return
    if not isinstance(interval, numbers.Real) or isinstance(interval, bool):
        return  # Celery's own setting: Celery reports its own errors
    if lease <= float(interval):
        raise ImproperlyConfigured(
            f"singleton_beat_lease ({lease:g} s) must be longer than the beat loop interval "
            f"(beat_max_loop_interval / --max-interval: {float(interval):g} s): a leader may "
            "sleep that long between ticks and would lose its lease meanwhile; raise "
            "singleton_beat_lease or lower the interval"
        )


def entry_catch_up(options: Mapping[str, Any] | None, default: str, entry: str) -> str:
    """The catch-up rule of a schedule entry: its ``options['catch_up']``, else
    ``default``. ``ImproperlyConfigured`` naming the entry for a value not in the set."""
    value = (options or {}).get(CATCH_UP_OPTION)
    if value is None:
        return default
    return _catch_up(value, f"beat_schedule[{entry!r}] options {CATCH_UP_OPTION!r}")


def reference_markdown() -> str:
    """The table of the beat settings for docs/beat.md, generated from :class:`BeatSettings`."""
    lines = ["| setting | default | values | meaning |", "|---|---|---|---|"]
    for row in _rows():
        default = "`None`" if row.default is None else f"`{row.default!r}`"
        doc = str(row.metadata["doc"]).replace("|", "\\|")
        lines.append(
            f"| `{BEAT_PREFIX}{row.name}` | {default} | {row.metadata['values']} | {doc} |"
        )
    return "\n".join(lines) + "\n"

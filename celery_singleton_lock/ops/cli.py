"""The ``celery locks`` sub-command: see, clear and compute the keys of singleton locks.

Installed through the ``celery.commands`` entry point, so it runs with the app given to
``celery -A proj``::

    celery -A proj locks list [--json] [--match PATTERN]
    celery -A proj locks clear KEY... | --all | --match PATTERN [--yes]
    celery -A proj locks key TASK_NAME [ARGS_JSON [KWARGS_JSON]]
    celery -A proj locks explain TASK [ARGS...] [--kwargs JSON] [--json]
    celery -A proj locks check [--json] [--strict]
    celery -A proj locks limit set NAME N | unset NAME | list [--json]
    celery -A proj locks beat [--json] [--group NAME]

``list`` and ``clear`` talk to the lock Redis (``singleton_lock_url``) with SCAN, never
KEYS, and read lock state against the Redis server's clock; ``clear --all`` and ``--match``
delete through :func:`.admin.clear_locks`. ``key`` needs no Redis: it derives the key the
same way a task call does. ``check`` is a preflight of the lock Redis for CI (exit status 0
when ready; see :mod:`.checks`). ``limit`` sets and shows the numbers of stacked limits
(``lock_limits``) at run time (see :mod:`.limits`). Passwords are masked in every printed
URL.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click
import redis
from celery._state import get_current_app
from celery.bin.base import CeleryCommand, CeleryOption, CLIContext, handle_preload_options
from celery.exceptions import CeleryCommandException, ImproperlyConfigured
from celery.platforms import EX_FAILURE, EX_OK, EX_UNAVAILABLE

from celery_singleton_lock import _observe as observe

# Celery loads every ``celery.commands`` entry point for any sub-command, so importing
# ``integration`` here wires config-locked tasks in ``celery worker``/``beat`` processes.
from celery_singleton_lock import integration  # noqa: F401
from celery_singleton_lock.beat.config import read_beat_settings
from celery_singleton_lock.beat.scheduler import group_key
from celery_singleton_lock.beat.state import read_group, state_name
from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine.wire import LockClient, server_time
from celery_singleton_lock.ops.admin import (
    HEADINGS,
    LockRow,
    clear_locks,
    decode_key,
    delete_locks,
    lock_glob,
    prefix_pattern,
    read_locks,
)
from celery_singleton_lock.ops.checks import FAIL, OK, WARN, Report, run_checks
from celery_singleton_lock.ops.explain import explain_task, json_arguments, render
from celery_singleton_lock.ops.limits import HEADINGS as LIMIT_HEADINGS
from celery_singleton_lock.ops.limits import (
    capacities_key,
    closest,
    code_limits,
    has_fields,
    name_problem,
    read_limits_reading,
    set_limit,
    templates_of,
    unset_limit,
)
from celery_singleton_lock.ops.reconcile import LockState, lock_states, reap, watch_seconds
from celery_singleton_lock.options import Settings
from celery_singleton_lock.runtime import locking_for

if TYPE_CHECKING:
    from celery import Celery

    from celery_singleton_lock.runtime import TaskLocking

__all__ = ["locks"]

#: How many keys a confirmation prompt names before it only counts the rest.
_PROMPT_NAMES = 10


# ----------------------------------------------------------------------------- helpers


def _app(ctx: click.Context) -> Celery:
    """The app of ``celery -A proj``, or Celery's current app when run without one."""
    obj = ctx.find_object(CLIContext)
    return obj.app if obj is not None else get_current_app()


def _settings(app: Celery) -> Settings:
    """The app's lock settings; a bad setting becomes its ImproperlyConfigured message."""
    try:
        return settings_for(app)
    except ImproperlyConfigured as exc:
        raise click.ClickException(_one_line(str(exc))) from exc


def _one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


def _plural(count: int, word: str) -> str:
    """``"1 lock"``, ``"2 locks"``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


#: sysexits.h "permission denied": the lock Redis refused the ACL user a command or a key
#: (NOPERM), or its credentials (WRONGPASS); not the same as unreachable (69).
EX_NOPERM = 77
#: redis-py's errors for a refused user (AuthorizationError is missing from old versions).
_REFUSALS: tuple[type[BaseException], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in ("NoPermissionError", "AuthenticationError", "AuthorizationError")
    if hasattr(redis.exceptions, name)
)


def _denied(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is Redis refusing the user: a command or key the
    ACL does not grant (NOPERM), or bad credentials (WRONGPASS, an AuthenticationError)."""
    seen: BaseException | None = exc
    for _ in range(5):  # a LockBackendError wraps redis-py's error once
        if seen is None:
            break
        if isinstance(seen, _REFUSALS):
            return True
        if any(word in str(seen) for word in ("NOPERM", "WRONGPASS", "NOAUTH")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _redis_failure(url: str, exc: BaseException, what: str) -> CeleryCommandException:
    """The one-line error of a Redis failure: exit status 77 (EX_NOPERM) when the ACL user
    was refused, else 69 (EX_UNAVAILABLE)."""
    if _denied(exc):
        return CeleryCommandException(
            message=_one_line(
                f"lock Redis at {mask_url(url)} refused this user: {type(exc).__name__}: "
                f"{exc} (grant it what `celery locks check` and the docs' least-privilege "
                "ACL list)"
            ),
            exit_code=EX_NOPERM,
        )
    return CeleryCommandException(
        message=_one_line(f"lock Redis at {mask_url(url)} {what}: {type(exc).__name__}: {exc}"),
        exit_code=EX_UNAVAILABLE,
    )


@contextlib.contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Turn Redis failures into a one-line error: exit status 77 (EX_NOPERM) when the user
    was refused a command, a key or its credentials, else 69 (EX_UNAVAILABLE)."""
    try:
        yield
    except redis.RedisError as exc:
        raise _redis_failure(url, exc, "failed") from exc


def _client(app: Celery, settings: Settings) -> LockClient:
    """The app's lock client (built lazily; connecting happens on the first command)."""
    try:
        return redis_for(app, settings.url)
    except ValueError as exc:  # e.g. a sentinel:// URL without a master name
        raise click.ClickException(f"singleton_lock_url: {_one_line(str(exc))}") from exc


# ------------------------------------------------------------------------------ group


@click.group()
@click.pass_context
@handle_preload_options
def locks(ctx: click.Context, **kwargs: Any) -> None:
    """List, clear and compute the keys of singleton locks."""


# ------------------------------------------------------------------------------- list


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


@locks.command(name="list", cls=CeleryCommand)
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="List Options",
    help="Print a JSON list of objects (lease_left in seconds) instead of a table.",
)
@click.option(
    "--match",
    "pattern",
    cls=CeleryOption,
    metavar="PATTERN",
    help_group="List Options",
    help="SCAN this glob instead of '<prefix>:*', e.g. 'orders:*' for RedisLock names "
    "of your own; only values that look like locks are listed then.",
)
@click.pass_context
def list_locks(ctx: click.Context, as_json: bool, pattern: str | None) -> None:
    """Show the locks under the prefix, with their holders.

    One row per lock key: holder task id and name, host/pid, lease left, fencing token
    and whether it is a queue-scope lock taken at publish. Locks whose lease has ended
    but whose key still exists show "expired".
    """
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    match = pattern if pattern is not None else prefix_pattern(settings.prefix)
    with _redis_errors(settings.url):
        states = lock_states(client, match)
        now_us = server_time(client)[1]
    rows = [(state, row) for state in states for row in state.holders]
    if pattern is not None:
        rows = [(state, row) for state, row in rows if row.kind != "foreign"]
    if as_json:
        click.echo(json.dumps([_row_json(state, row, now_us) for state, row in rows], indent=2))
        return
    held = sum(row.held for _, row in rows)
    summary = f"{held} held" + (f", {len(rows) - held} expired" if len(rows) > held else "")
    click.echo(f"Locks matching {match!r} on {mask_url(settings.url)}: {summary}")
    if rows:
        table = [(*HEADINGS, *_EXTRA), *(_row_cells(state, row, now_us) for state, row in rows)]
        for line in _table(table):
            click.echo(line)


#: Columns ``list`` adds to each holder row: what the run is doing and who comes next.
_EXTRA = ("STATE", "AGE", "WAITERS", "PARKED", "FOLLOW-UP")


def _state_of(row: LockRow) -> str:
    if not row.held:
        return "expired"
    if row.info.get("held") == "success":
        return "held"
    return "queued" if row.queued else "running"


def _age(row: LockRow, now_us: int) -> float | None:
    """Seconds since the hold began (its fencing token is the server clock then)."""
    if row.fence is None or not 0 < row.fence <= now_us:
        return None
    return round(float(now_us - row.fence) / 1_000_000, 1)


def _row_json(state: LockState, row: LockRow, now_us: int) -> dict[str, Any]:
    return {
        **row.as_json(),
        "state": _state_of(row),
        "age": _age(row, now_us),
        "waiters": state.waiters,
        "parked": state.parked,
        "pending": state.pending,
    }


def _row_cells(state: LockState, row: LockRow, now_us: int) -> tuple[str, ...]:
    age = _age(row, now_us)
    waiters = ", ".join(state.waiters[:3]) + (" ..." if len(state.waiters) > 3 else "")
    return (
        *row.cells(),
        _state_of(row),
        f"{age}s" if age is not None else "-",
        waiters or "-",
        str(state.parked) if state.parked else "-",
        state.pending or "-",
    )


# ------------------------------------------------------------------------------ clear


def _confirm(what: str, keys: Sequence[str], url: str) -> None:
    """Ask before deleting; a "no" or a closed stdin aborts with a non-zero status."""
    shown = "\n".join(f"  {key}" for key in keys[:_PROMPT_NAMES])
    more = f"\n  ... and {len(keys) - _PROMPT_NAMES} more" if len(keys) > _PROMPT_NAMES else ""
    click.confirm(
        f"This deletes {what} on {mask_url(url)}:\n{shown}{more}\n"
        "A task still running under a cleared lock is no longer exclusive, and there is "
        "no undo.\n(to skip this prompt use --yes)\nClear them?",
        abort=True,
        err=True,
    )


def _clear_given(client: LockClient, settings: Settings, keys: Sequence[str], yes: bool) -> None:
    """Delete the named locks and their signal lists, after checking each is a lock.

    A key that is not a string (no lock is) and lies outside the prefix is refused, so a
    typo cannot delete broker data; then nothing at all is deleted.
    """
    unique = list(dict.fromkeys(keys))
    pipe = client.pipeline(transaction=False)
    for key in unique:
        pipe.type(key)
    types = [decode_key(kind) for kind in pipe.execute()]
    under_prefix = f"{settings.prefix}:"
    refused = [
        f"{key!r} is a {kind}"
        for key, kind in zip(unique, types, strict=True)
        if kind not in ("string", "none") and not key.startswith(under_prefix)
    ]
    if refused:
        raise click.ClickException(
            f"refusing to delete keys that are not locks: {'; '.join(refused)} (nothing deleted)"
        )
    present = [key for key, kind in zip(unique, types, strict=True) if kind != "none"]
    for key in unique:
        if key not in present:
            click.echo(f"not found (already free): {key}", err=True)
    if not present:
        click.echo("Cleared 0 locks.")
        return
    if not yes:
        _confirm(_plural(len(present), "lock"), present, settings.url)
    cleared = delete_locks(client, present)
    click.echo(f"Cleared {_plural(cleared, 'lock')}.")


def _clear_matching(
    app: Celery, client: LockClient, settings: Settings, match: str, yes: bool
) -> None:
    """Delete every lock of this package matching ``match`` below the prefix, as
    ``clear_locks(app, match)`` does (it is what deletes them, after the confirmation).
    Keys there whose value is not one of our locks (a classic timestamp, data of your own)
    are left alone and counted."""
    pattern = lock_glob(settings.prefix, match)
    rows = read_locks(client, pattern)
    ours = [row.key for row in rows if row.kind == "lock"]
    left = len(rows) - len(ours)
    note = f"; left {_plural(left, 'key')} that are not locks of this package" if left else ""
    if not ours:
        click.echo(f"No locks match {pattern!r}; nothing to clear{note}.")
        return
    if not yes:
        _confirm(f"all {_plural(len(ours), 'lock')} matching {pattern!r}", ours, settings.url)
    cleared = clear_locks(app, match)
    click.echo(f"Cleared {_plural(cleared, 'lock')} matching {pattern!r}{note}.")


@locks.command(cls=CeleryCommand)
@click.argument("keys", nargs=-1, metavar="[KEY]...")
@click.option(
    "--all",
    "clear_all",
    cls=CeleryOption,
    is_flag=True,
    help_group="Clear Options",
    help="Clear every lock under the lock prefix (singleton_lock_prefix); other keys "
    "there are left alone.",
)
@click.option(
    "--match",
    "match",
    cls=CeleryOption,
    metavar="PATTERN",
    help_group="Clear Options",
    help="Clear the locks whose key matches this glob below the prefix, e.g. 'billing.*' "
    "(what clear_locks(app, PATTERN) does); --all is --match '*'.",
)
@click.option(
    "-y",
    "--yes",
    cls=CeleryOption,
    is_flag=True,
    help_group="Clear Options",
    help="Don't prompt for confirmation.",
)
@click.pass_context
def clear(
    ctx: click.Context, keys: tuple[str, ...], clear_all: bool, match: str | None, yes: bool
) -> None:
    """Delete the given lock keys, every lock under the prefix with --all, or those
    matching --match.

    Each lock's waiters' signal list goes with it; waiting tasks notice the free lock at
    once. Asks first unless --yes. There is no undo.
    """
    given = sum((bool(keys), clear_all, match is not None))
    if given != 1:
        raise click.UsageError(
            "give the lock KEYs to clear, --all or --match, only one of them"
            if given
            else "give the lock KEYs to clear (see `locks list`), --all or --match",
            ctx,
        )
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    with _redis_errors(settings.url):
        if keys:
            _clear_given(client, settings, keys, yes)
        else:
            _clear_matching(app, client, settings, "*" if clear_all else str(match), yes)


# -------------------------------------------------------------------------------- key


def _json_param(text: str, kind: type, param: str, example: str) -> Any:
    """Parse one JSON argument of ``locks key``, which must be a ``kind`` (list or dict)."""
    label = "array" if kind is list else "object"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc}); give a JSON {label}, e.g. {example}", param_hint=param
        ) from exc
    if not isinstance(value, kind):
        raise click.BadParameter(
            f"must be a JSON {label}, e.g. {example}; got {type(value).__name__}",
            param_hint=param,
        )
    return value


def _locked_task(
    app: Celery, task_name: str, *, hint: str | None = None
) -> tuple[Any, TaskLocking]:
    """The task named ``task_name`` (the app's modules imported) and its locking; a click
    error naming what is wrong (unknown, badly configured, or not locked; ``hint``: the
    parameter an unknown name is reported against)."""
    app.loader.import_default_modules()
    if task_name not in app.tasks:
        unknown = _unknown_task(app, task_name)
        if hint is not None:
            unknown.param_hint = hint
        raise unknown
    task = app.tasks[task_name]
    try:
        locking = locking_for(task)
    except ImproperlyConfigured as exc:
        raise click.ClickException(_one_line(str(exc))) from exc
    if locking is None:
        raise click.ClickException(
            f"task {task_name!r} is not locked: it is not a LockedTask and no "
            "singleton_lock_tasks glob matches it"
        )
    return task, locking


def _unknown_task(app: Celery, name: str) -> click.BadParameter:
    """The error for a task name the app does not know, naming the closest ones."""
    names = sorted(task for task in app.tasks if not task.startswith("celery."))
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    close += [task for task in names if task.rsplit(".", 1)[-1] == name and task not in close]
    if close:
        hint = "did you mean " + ", ".join(repr(task) for task in close) + "?"
    elif names:
        hint = "registered tasks: " + ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    else:
        hint = "the app has no tasks registered; check -A and its imports"
    return click.BadParameter(f"unknown task {name!r}; {hint}", param_hint="TASK_NAME")


def _fitting_kwargs(
    task_name: str, func: Any, args: list[Any], kwargs: dict[str, Any], lock_keys: object
) -> dict[str, Any]:
    """``kwargs`` of a call that fits the task's signature, so the key printed is the one a
    real call uses; ``BadParameter`` (exit status 2) when the arguments do not fit.

    The only arguments that may be left out are required ones that ``lock_keys`` does not
    name (or every one, under ``lock_keys=()``): they do not take part in the key, so they
    are filled with None here, and a note on stderr says so.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return kwargs  # no introspectable signature: keys.py binds what it can
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        problem = str(exc)
    else:
        return kwargs
    empty = inspect.Parameter.empty
    shown = signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )
    hint = (
        f"these arguments do not fit {task_name}{shown}: {problem}; a call with them "
        "fails, so no call uses the key they would give"
    )
    try:
        partial = signature.bind_partial(*args, **kwargs)
    except TypeError:
        raise click.BadParameter(hint, param_hint="ARGS_JSON / KWARGS_JSON") from None
    missing = [
        name
        for name, parameter in signature.parameters.items()
        if name not in partial.arguments
        and parameter.default is inspect.Parameter.empty
        and parameter.kind
        in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    named = tuple(lock_keys) if isinstance(lock_keys, (list, tuple)) else None
    if not missing or named is None or any(name in named for name in missing):
        raise click.BadParameter(
            f"{hint} (give every argument: the key depends on "
            f"{'the missing ones' if missing else 'all of them'})",
            param_hint="ARGS_JSON / KWARGS_JSON",
        )
    click.echo(
        f"note: {', '.join(missing)} left out: lock_keys={list(named)!r} does not use "
        f"{'it' if len(missing) == 1 else 'them'}, so every call with these arguments has "
        "this key",
        err=True,
    )
    return {**kwargs, **dict.fromkeys(missing)}


@locks.command(name="key", cls=CeleryCommand)
@click.argument("task_name")
@click.argument("args_json", required=False, default="[]")
@click.argument("kwargs_json", required=False, default="{}")
@click.pass_context
def key_for(ctx: click.Context, task_name: str, args_json: str, kwargs_json: str) -> None:
    """Print the lock key of a task call.

    TASK_NAME is called with ARGS_JSON (a JSON array) and KWARGS_JSON (a JSON object);
    the key follows the task's effective lock options, as a worker computes it.
    """
    args = _json_param(args_json, list, "ARGS_JSON", "'[\"sku-1\", 7]'")
    kwargs = _json_param(kwargs_json, dict, "KWARGS_JSON", '\'{"sku": "sku-1"}\'')
    app = _app(ctx)
    _settings(app)
    task, locking = _locked_task(app, task_name)
    kwargs = _fitting_kwargs(task_name, task.run, args, kwargs, locking.options.keys)
    try:
        key = locking.key(args, kwargs)
    except Exception as exc:  # a user's lock_keys callable may raise anything
        raise click.ClickException(
            f"lock_keys of task {task_name!r} raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    click.echo(key)


# ---------------------------------------------------------------------------- explain


@locks.command(name="explain", cls=CeleryCommand, context_settings={"ignore_unknown_options": True})
@click.argument("task_name", metavar="TASK")
@click.argument("args", nargs=-1, metavar="[ARGS]...")
@click.option(
    "--kwargs",
    "kwargs_json",
    cls=CeleryOption,
    metavar="JSON",
    default="{}",
    help_group="Explain Options",
    help="The keyword arguments of the call, as a JSON object, e.g. '{\"user_id\": 7}'.",
)
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Explain Options",
    help="Print a JSON object (key, state, holders, waiters, parked, follow_up, throttle, "
    "debounce, ...) instead of text.",
)
@click.pass_context
def explain(
    ctx: click.Context, task_name: str, args: tuple[str, ...], kwargs_json: str, as_json: bool
) -> None:
    """Explain why a call of TASK with these arguments is blocked now.

    Each ARG is one positional argument as a JSON value ('"sku-42"' 7); --kwargs gives the
    keyword arguments as a JSON object. The key is computed as `locks key` computes it;
    then its holders (task id, host/pid, since when, lease left, fencing token), waiters
    and parked calls in turn order, pending follow-up, throttle window and debounce burst
    are read from the lock Redis, on its clock.
    """
    try:
        values = json_arguments(args)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ARGS") from exc
    kwargs = _json_param(kwargs_json, dict, "--kwargs", "'{\"user_id\": 7}'")
    app = _app(ctx)
    settings = _settings(app)
    task, locking = _locked_task(app, task_name, hint="TASK")
    try:
        kwargs = _fitting_kwargs(task_name, task.run, values, kwargs, locking.options.keys)
    except click.BadParameter as exc:
        exc.param_hint = "ARGS / --kwargs"
        raise
    try:
        locking.key(values, kwargs)
    except Exception as exc:  # a user's lock_keys callable may raise anything
        raise click.ClickException(
            f"lock_keys of task {task_name!r} raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    _client(app, settings)  # a bad singleton_lock_url is reported as `list` reports it
    with _redis_errors(settings.url):
        explanation = explain_task(task, values, kwargs)
    click.echo(render(explanation, as_json=as_json))


# ------------------------------------------------------------------------------ check

#: sysexits.h "configuration error": a bad singleton_lock_* setting (as the worker exits).
EX_CONFIG = 78
_MARKS = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}


def _print_report(report: Report) -> None:
    """The report as one line per check under a heading, then a summary line."""
    mode = "scripts" if report.scripting else "plain commands"
    click.echo(f"Checking the lock Redis at {report.url} (prefix {report.prefix!r}, {mode})")
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        click.echo(f"  {_MARKS[check.status]:<4}  {check.name:<{width}}  {check.detail}")
    click.echo(f"{_plural(report.failures, 'failure')}, {_plural(report.warnings, 'warning')}")


@locks.command(name="check", cls=CeleryCommand)
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Check Options",
    help="Print a JSON object (url, prefix, scripting, checks, failures, warnings).",
)
@click.option(
    "--strict",
    cls=CeleryOption,
    is_flag=True,
    help_group="Check Options",
    help="Exit with status 1 on warnings too, not only on failures.",
)
@click.pass_context
def check(ctx: click.Context, as_json: bool, strict: bool) -> None:
    """Preflight the lock Redis: server version, maxmemory-policy, scripting, clock
    offset, and the user's permission for every command the locks use.

    Exit status: 0 ready (warnings allowed unless --strict); 1 a check failed (or warned,
    with --strict); 69 the lock Redis is unreachable; 77 it refused this user (bad
    credentials, or a command the ACL does not grant before any check ran); 78 a
    singleton_lock_* setting is bad.
    """
    app = _app(ctx)
    try:
        settings = settings_for(app)
    except ImproperlyConfigured as exc:
        raise CeleryCommandException(message=_one_line(str(exc)), exit_code=EX_CONFIG) from exc
    try:
        report = run_checks(app)
    except ValueError as exc:  # e.g. a sentinel:// URL without a master name
        raise CeleryCommandException(
            message=f"singleton_lock_url: {_one_line(str(exc))}", exit_code=EX_CONFIG
        ) from exc
    except redis.RedisError as exc:
        raise _redis_failure(settings.url, exc, "unreachable") from exc
    if as_json:
        click.echo(
            json.dumps(
                {
                    "url": report.url,
                    "prefix": report.prefix,
                    "scripting": report.scripting,
                    "checks": [item.as_json() for item in report.checks],
                    "failures": report.failures,
                    "warnings": report.warnings,
                },
                indent=2,
            )
        )
    else:
        _print_report(report)
    failed = report.failures or (strict and report.warnings)
    ctx.exit(EX_FAILURE if failed else EX_OK)


# ------------------------------------------------------------------------------- reap


@locks.command(name="reap", cls=CeleryCommand)
@click.option(
    "--dry-run",
    cls=CeleryOption,
    is_flag=True,
    help_group="Reap Options",
    help='Print the same lines ("would free" for a hold proven gone); free nothing.',
)
@click.option(
    "--watch",
    cls=CeleryOption,
    type=float,
    default=None,
    metavar="SECONDS",
    help_group="Reap Options",
    help="How long to watch the holds for renewals (default: each hold until its renewal "
    "was due, a third of the lease it has left plus a margin; a hold taken at publish "
    "5 s). A lease that runs out meanwhile proves its hold gone.",
)
@click.option(
    "--match",
    "pattern",
    cls=CeleryOption,
    metavar="PATTERN",
    help_group="Reap Options",
    help="Only locks matching this glob (default '<prefix>:*').",
)
@click.pass_context
def reap_locks(ctx: click.Context, dry_run: bool, watch: float | None, pattern: str | None) -> None:
    """Free the holds whose holder is proven gone, never a running one.

    A hold is proven gone when its lease ran out, when the process that took it was of
    this host and is gone, or, taken at publish, when its message is in no queue of a Redis
    broker; and no worker that answers inspect has its task. A hold renewed while watched,
    whose task a worker has or whose message waits is alive and not shown. Every other
    hold is printed "unproven" with why and left: no answer from a worker (a busy solo
    worker, remote control off) proves nothing. Freeing is owner-checked. Exit status 0
    whatever was found; a lock Redis failure exits as the other commands do.
    """
    try:
        watch = watch_seconds(watch)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--watch") from exc
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    match = pattern if pattern is not None else prefix_pattern(settings.prefix)
    # The tasks' own ``queue`` options are among the queues searched; a task module that
    # fails to import leaves only its tasks' queues unknown (bound ones are still searched).
    with contextlib.suppress(Exception):
        app.loader.import_default_modules()

    def announce(holds: int, seconds: float) -> None:
        if seconds >= 2:
            held = _plural(holds, "hold")
            click.echo(f"watching {held} for renewals, up to {seconds:.0f}s", err=True)

    with _redis_errors(settings.url):
        reaped = reap(
            app,
            client,
            match,
            watch=watch,
            dry_run=dry_run,
            scripting=settings.scripting,
            announce=announce,
        )
    for found in reaped:
        if not found.proven:
            verb = "unproven"
        elif dry_run:
            verb = "would free"
        else:
            verb = "freed" if found.freed else "left (changed hands)"
        click.echo(f"{verb} {found.key} task {found.task_id or '-'}: {found.why}")
        if found.freed:
            observe.reaped(app, found.key, found.task_id, why=found.why)
    if not any(found.proven for found in reaped):
        unproven = sum(not found.proven for found in reaped)
        click.echo("nothing to reap" + (f" ({unproven} unproven)" if unproven else ""))


# ------------------------------------------------------------------------------ limit


@locks.group(name="limit")
def limit() -> None:
    """Set and show the numbers of stacked limits (lock_limits) at run time."""


def _check_limit_name(name: str) -> None:
    """A usage error unless ``name`` can name a limit, saying why."""
    problem = name_problem(name)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="NAME")


def _unknown_limit_warning(name: str, templates: Sequence[str]) -> str | None:
    """The warning for a NAME no registered task's ``lock_limits`` has as a template or
    renders (a typo is set where no run ever reads it); None when one does."""
    if not templates:
        return (
            f"warning: no registered task has lock_limits, so no run reads {name!r} "
            "(check -A and its imports); set anyway"
        )
    if templates_of(name, templates):
        return None
    guess = closest(name, templates)
    hint = f"did you mean {guess!r}? " if guess is not None else ""
    return (
        f"warning: {name!r} is neither a lock_limits template of a registered task nor a "
        f"name one renders, so no run reads it; {hint}known templates: "
        f"{', '.join(repr(template) for template in templates)}; set anyway"
    )


@limit.command(name="set", cls=CeleryCommand, context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("number", metavar="N", type=int)
@click.pass_context
def limit_set(ctx: click.Context, name: str, number: int) -> None:
    """Set limit NAME to N runs' weight at once, in the lock Redis.

    NAME is a limit's rendered name ('tenant:7') or its template as the code writes it
    ('tenant:{tenant_id}': every rendering without a number of its own). Runs read the
    number by name, then by template, then take the code's. Lowering it never stops work
    that is running: new runs are held back until they fit. N=0 holds back every new run.
    """
    _check_limit_name(name)
    if number < 0:
        raise click.BadParameter(
            f"must be a whole number >= 0 (0 holds back every new run), got {number}",
            param_hint="N",
        )
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    templates = tuple(dict.fromkeys(item.template for item in code_limits(app)))
    warning = _unknown_limit_warning(name, templates)
    if warning is not None:
        click.echo(warning, err=True)
    with _redis_errors(settings.url):
        set_limit(client, settings.prefix, name, number)
    scope = (
        " (every rendering of it without a number of its own)"
        if name in templates and has_fields(name)
        else ""
    )
    click.echo(
        f"Set limit {name!r} to {number}{scope} on {mask_url(settings.url)}: running work "
        "is never stopped; new runs are held back until they fit."
    )


@limit.command(name="unset", cls=CeleryCommand)
@click.argument("name")
@click.pass_context
def limit_unset(ctx: click.Context, name: str) -> None:
    """Remove the number set for limit NAME in the lock Redis: its runs then follow its
    template's number, else the code's. Any NAME found in `limit list` can be removed,
    including one written there by other means."""
    if not name:
        raise click.BadParameter("a limit name cannot be empty", param_hint="NAME")
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    with _redis_errors(settings.url):
        removed = unset_limit(client, settings.prefix, name)
    if removed:
        follow = (
            "its renderings without a number of their own now follow the code's"
            if has_fields(name)
            else "its runs now follow its template's number, else the code's"
        )
        click.echo(f"Unset limit {name!r} on {mask_url(settings.url)}: {follow}.")
    else:
        click.echo(f"Limit {name!r} was not set on {mask_url(settings.url)}; nothing changed.")


@limit.command(name="list", cls=CeleryCommand)
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Limit Options",
    help="Print a JSON list of objects (code and applies are lists) instead of a table.",
)
@click.pass_context
def limit_list(ctx: click.Context, as_json: bool) -> None:
    """Show every stacked limit, from the code and from the lock Redis.

    One row per limit or template: the number in the code (CODE), the number set in Redis
    by that exact name (SET), the number runs meet now (APPLIES: by name, then template,
    then code), the weight its live shares hold (IN USE) and how many there are (HOLDS),
    on the Redis server's clock, and the tasks whose lock_limits have it. A key there that
    holds a value of another type is named in a warning on stderr (and in the problems of
    its rows; ? in the cells it leaves unknown); the rest is still shown (exit status 0).
    """
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    code = code_limits(app)
    with _redis_errors(settings.url):
        reading = read_limits_reading(client, settings.prefix, code)
    rows = reading.rows
    for problem in reading.problems:
        click.echo(f"warning: {problem}", err=True)
    if as_json:
        click.echo(json.dumps([row.as_json() for row in rows], indent=2))
        return
    click.echo(
        f"Stacked limits on {mask_url(settings.url)} (numbers set in "
        f"{capacities_key(settings.prefix)!r}): {_plural(len(rows), 'limit')}"
    )
    if rows:
        for line in _table([LIMIT_HEADINGS, *(row.cells() for row in rows)]):
            click.echo(line)


# ------------------------------------------------------------------------------- beat


@locks.command(name="beat", cls=CeleryCommand)
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Beat Options",
    help="Print a JSON object (key, now, leader, replicas, slots) instead of text.",
)
@click.option(
    "--group",
    cls=CeleryOption,
    metavar="NAME",
    default=None,
    help_group="Beat Options",
    help="The beat group (default: singleton_beat_name, else the app's main name).",
)
@click.pass_context
def beat_state(ctx: click.Context, as_json: bool, group: str | None) -> None:
    """Show the beat group of LeaderScheduler replicas: who leads (replica, host/pid,
    since when, lease left, fencing token), the replicas seen lately (each heartbeats with
    a TTL) and the last slot taken per schedule entry, on the lock Redis's clock."""
    app = _app(ctx)
    settings = _settings(app)
    try:
        beat = read_beat_settings(app.conf)
    except ImproperlyConfigured as exc:
        raise click.ClickException(_one_line(str(exc))) from exc
    name = group or beat.name or app.main or "default"
    client = _client(app, settings)
    with _redis_errors(settings.url):
        state = read_group(client, group_key(settings.prefix, name))
    if as_json:
        click.echo(json.dumps(state.as_json(), indent=2))
        return
    click.echo(f"Beat group {name!r} on {mask_url(settings.url)} ({state.key})")
    leader = state.leader
    if leader is None:
        click.echo("leader: none (no replica holds the lease)")
    else:
        click.echo(
            f"leader: {leader['replica'] or '-'} on {leader['host'] or '-'}/{leader['pid'] or '-'}"
            f", since {leader['since'] or '-'}, lease left {leader['lease_left']:.1f}s, "
            f"fencing token {leader['fencing_token']}"
        )
    click.echo(f"replicas seen: {len(state.replicas)}")
    if state.replicas:
        rows = [("REPLICA", "ROLE", "HOST/PID", "HEARTBEAT LEFT")]
        rows += [
            (r.replica, r.role or "-", f"{r.host or '-'}/{r.pid or '-'}", f"{r.seen_for:.1f}s")
            for r in state.replicas
        ]
        for line in _table(rows):
            click.echo(f"  {line}")
    click.echo(f"last slot taken per entry: {len(state.slots)}")
    if state.slots:
        rows = [("ENTRY", "SLOT (UTC)", "STATE", "FENCE")]
        rows += [
            (entry, state.as_json()["slots"][entry]["slot"], state_name(record), str(record.fence))
            for entry, record in sorted(state.slots.items())
        ]
        for line in _table(rows):
            click.echo(f"  {line}")

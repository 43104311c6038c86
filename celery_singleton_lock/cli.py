"""The ``celery locks`` sub-command: see, clear and compute the keys of singleton locks.

Installed through the ``celery.commands`` entry point, so it runs with the app given to
``celery -A proj``::

    celery -A proj locks list [--json] [--match PATTERN]
    celery -A proj locks clear KEY... | --all [--yes]
    celery -A proj locks key TASK_NAME [ARGS_JSON [KWARGS_JSON]]

``list`` and ``clear`` talk to the lock Redis (``singleton_lock_url``) with SCAN, never
KEYS, and read lock state against the Redis server's clock. ``key`` needs no Redis: it
derives the key the same way a task call does. Passwords are masked in every printed URL.
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
from celery.platforms import EX_UNAVAILABLE

# Celery loads every ``celery.commands`` entry point for any sub-command, so importing
# ``integration`` here wires config-locked tasks in ``celery worker``/``beat`` processes.
from celery_singleton_lock import integration  # noqa: F401
from celery_singleton_lock._redis import LockClient
from celery_singleton_lock.admin import (
    HEADINGS,
    decode_key,
    delete_locks,
    prefix_pattern,
    read_locks,
)
from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.options import Settings
from celery_singleton_lock.runtime import locking_for

if TYPE_CHECKING:
    from celery import Celery

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


@contextlib.contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Turn Redis failures into a one-line error and exit status 69 (EX_UNAVAILABLE)."""
    try:
        yield
    except redis.RedisError as exc:
        raise CeleryCommandException(
            message=_one_line(f"lock Redis at {mask_url(url)} failed: {type(exc).__name__}: {exc}"),
            exit_code=EX_UNAVAILABLE,
        ) from exc


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
        rows = read_locks(client, match, foreign=pattern is None)
    if as_json:
        click.echo(json.dumps([row.as_json() for row in rows], indent=2))
        return
    held = sum(row.held for row in rows)
    summary = f"{held} held" + (f", {len(rows) - held} expired" if len(rows) > held else "")
    click.echo(f"Locks matching {match!r} on {mask_url(settings.url)}: {summary}")
    if rows:
        for line in _table([HEADINGS, *(row.cells() for row in rows)]):
            click.echo(line)


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


def _clear_all(client: LockClient, settings: Settings, yes: bool) -> None:
    """Delete every lock of this package under the prefix. Keys there whose value is not
    one of our locks (a classic timestamp, data of your own) are left alone and counted."""
    pattern = prefix_pattern(settings.prefix)
    rows = read_locks(client, pattern)
    ours = [row.key for row in rows if row.kind == "lock"]
    left = len(rows) - len(ours)
    note = f"; left {_plural(left, 'key')} that are not locks of this package" if left else ""
    if not ours:
        click.echo(f"No locks match {pattern!r}; nothing to clear{note}.")
        return
    if not yes:
        _confirm(f"all {_plural(len(ours), 'lock')} matching {pattern!r}", ours, settings.url)
    cleared = delete_locks(client, ours)
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
    "-y",
    "--yes",
    cls=CeleryOption,
    is_flag=True,
    help_group="Clear Options",
    help="Don't prompt for confirmation.",
)
@click.pass_context
def clear(ctx: click.Context, keys: tuple[str, ...], clear_all: bool, yes: bool) -> None:
    """Delete the given lock keys, or every key under the prefix with --all.

    Each lock's waiters' signal list goes with it; waiting tasks notice the free lock
    within their fallback poll. Asks first unless --yes. There is no undo.
    """
    if bool(keys) == clear_all:
        raise click.UsageError(
            "give the lock KEYs to clear or --all, not both"
            if keys
            else "give the lock KEYs to clear (see `locks list`) or --all",
            ctx,
        )
    app = _app(ctx)
    settings = _settings(app)
    client = _client(app, settings)
    with _redis_errors(settings.url):
        if clear_all:
            _clear_all(client, settings, yes)
        else:
            _clear_given(client, settings, keys, yes)


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
    app.loader.import_default_modules()
    if task_name not in app.tasks:
        raise _unknown_task(app, task_name)
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
    try:
        inspect.signature(task.run).bind(*args, **kwargs)
    except TypeError as exc:
        click.echo(
            f"warning: these arguments do not fit {task_name}: {exc}; a call with them fails",
            err=True,
        )
    except ValueError:
        pass  # no introspectable signature: keys.py binds what it can
    try:
        key = locking.key(args, kwargs)
    except Exception as exc:  # a user's lock_keys callable may raise anything
        raise click.ClickException(
            f"lock_keys of task {task_name!r} raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    click.echo(key)

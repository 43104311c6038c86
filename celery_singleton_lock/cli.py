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
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import redis
from celery._state import get_current_app
from celery.bin.base import CeleryCommand, CeleryOption, CLIContext, handle_preload_options
from celery.exceptions import CeleryCommandException, ImproperlyConfigured
from celery.platforms import EX_UNAVAILABLE
from kombu.utils.url import maybe_sanitize_url

from celery_singleton_lock._value import Holder, LockValue, parse_value
from celery_singleton_lock.client import LockClient, redis_for
from celery_singleton_lock.config import Settings, settings_for
from celery_singleton_lock.keys import task_lock_key
from celery_singleton_lock.lock import companion_key
from celery_singleton_lock.task import options_for

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["locks"]

#: Keys asked for per SCAN call, and keys read or deleted per pipeline.
SCAN_COUNT = 500
#: Suffix of the waiters' signal list that sits next to every lock key.
SIGNAL_SUFFIX = "signal"
#: How many keys a confirmation prompt names before it only counts the rest.
_PROMPT_NAMES = 10
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


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


def safe_url(url: str) -> str:
    """``url`` with its password masked; each part of a ``;``-separated sentinel URL too."""
    parts = []
    for part in url.split(";"):
        try:
            parts.append(maybe_sanitize_url(part.strip()))
        except ValueError:
            parts.append("<unparsable URL>")
    return ";".join(parts)


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def prefix_pattern(prefix: str) -> str:
    """The SCAN pattern of every key under ``prefix`` (``prefix:*``, glob-escaped)."""
    return f"{_glob_escape(prefix)}:*"


def _plural(count: int, word: str) -> str:
    """``"1 lock"``, ``"2 locks"``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _decode(key: bytes | str) -> str:
    """A key as text; bytes that are not UTF-8 are shown escaped."""
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key


@contextlib.contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Turn Redis failures into a one-line error and exit status 69 (EX_UNAVAILABLE)."""
    try:
        yield
    except redis.RedisError as exc:
        raise CeleryCommandException(
            message=_one_line(f"lock Redis at {safe_url(url)} failed: {type(exc).__name__}: {exc}"),
            exit_code=EX_UNAVAILABLE,
        ) from exc


def _client(app: Celery, settings: Settings) -> LockClient:
    """The app's lock client (built lazily; connecting happens on the first command)."""
    try:
        return redis_for(app, settings.url)
    except ValueError as exc:  # e.g. a sentinel:// URL without a master name
        raise click.ClickException(f"singleton_lock_url: {_one_line(str(exc))}") from exc


def _scan(client: LockClient, pattern: str) -> Iterator[list[bytes | str]]:
    """Pages of the keys matching ``pattern`` (SCAN on every node of a cluster; each key
    once)."""
    seen: set[bytes | str] = set()
    page: list[bytes | str] = []
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        if key in seen:
            continue
        seen.add(key)
        page.append(key)
        if len(page) >= SCAN_COUNT:
            yield page
            page = []
    if page:
        yield page


# ------------------------------------------------------------------------------ group


@click.group()
@click.pass_context
@handle_preload_options
def locks(ctx: click.Context, **kwargs: Any) -> None:
    """List, clear and compute the keys of singleton locks."""


# ------------------------------------------------------------------------------- list


@dataclass(frozen=True)
class LockRow:
    """One lock key as ``locks list`` shows it.

    ``kind`` is ``"lock"`` (written by this package), ``"classic"`` (a plain expiry
    timestamp from a SETNX locker in another language) or ``"foreign"`` (any other
    string; held while the key has a TTL). ``lease_left`` is in seconds, None when free.
    """

    key: str
    kind: str
    held: bool
    lease_left: float | None
    fence: int | None
    info: dict[str, Any]

    @property
    def task_id(self) -> str | None:
        return _text(self.info.get("task_id"))

    @property
    def task(self) -> str | None:
        return _text(self.info.get("task"))

    @property
    def host(self) -> str | None:
        return _text(self.info.get("host"))

    @property
    def pid(self) -> int | None:
        pid = self.info.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    @property
    def queued(self) -> bool:
        return self.info.get("queued") is True

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON object (``--json``)."""
        return {
            "key": self.key,
            "kind": self.kind,
            "held": self.held,
            "task_id": self.task_id,
            "task": self.task,
            "host": self.host,
            "pid": self.pid,
            "lease_left": self.lease_left,
            "fence": self.fence,
            "queued": self.queued,
            "info": self.info,
        }

    def cells(self) -> tuple[str, ...]:
        """The row as table cells (``-`` where nothing is known)."""
        if self.kind == "classic":
            what = "(classic timestamp)"
        elif self.kind == "foreign":
            what = "(foreign value)"
        else:
            what = self.task or _text(self.info.get("text")) or "-"
        where = self.host or "-"
        if self.pid is not None:
            where = f"{where}/{self.pid}"
        lease = f"{self.lease_left:.1f}s" if self.lease_left is not None else "expired"
        return (
            self.key,
            self.task_id or "-",
            what,
            where,
            lease,
            str(self.fence) if self.fence is not None else "-",
            "yes" if self.queued else "no",
        )


_HEADINGS = ("KEY", "TASK ID", "TASK", "HOST/PID", "LEASE LEFT", "FENCE", "QUEUED")


def _text(value: object) -> str | None:
    """A holder-info field as text, None when absent."""
    return None if value is None else str(value)


def _info(value: LockValue) -> dict[str, Any]:
    """The holder info of a value whose lease has ended (as ``Holder.info`` reads it)."""
    if not value.info:
        return {}
    try:
        info = json.loads(value.info)
    except ValueError:
        return {"text": value.info}
    return info if isinstance(info, dict) else {"text": value.info}


def lock_row(key: str, raw: bytes | str, ttl_ms: int, now_ms: int) -> LockRow:
    """The row of one lock key from its value, its PTTL and the server time; never raises."""
    value = parse_value(raw)
    if value.expiry_ms is None:
        kind = "foreign"
    elif value.classic:
        kind = "classic"
    else:
        kind = "lock"
    holder: Holder | None = value.holder(now_ms, ttl_ms if ttl_ms >= 0 else None)
    if holder is None:
        return LockRow(key, kind, held=False, lease_left=None, fence=value.fence, info=_info(value))
    remaining = holder.remaining_ms
    return LockRow(
        key,
        kind,
        held=True,
        lease_left=round(remaining / 1000, 3) if remaining is not None else None,
        fence=holder.fence,
        info=holder.info,
    )


def read_locks(client: LockClient, pattern: str, *, foreign: bool = True) -> list[LockRow]:
    """Every string key matching ``pattern`` as a row, sorted by key.

    Each SCAN page is read with TIME and one pipeline (GET and PTTL per key). Keys that
    are not strings (the waiters' signal lists) are skipped, as are keys deleted meanwhile
    and, unless ``foreign``, values that are neither ours nor a classic timestamp.
    """
    rows: list[LockRow] = []
    for page in _scan(client, pattern):
        # TIME on its own: Redis Cluster pipelines refuse keyless commands (there it is one
        # node's clock, close enough for a listing).
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        pipe = client.pipeline(transaction=False)
        for key in page:
            pipe.get(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
        for index, key in enumerate(page):
            raw, ttl = replies[2 * index], replies[1 + 2 * index]
            if raw is None or isinstance(raw, redis.ResponseError):
                continue  # gone since SCAN, or not a string (WRONGTYPE): not a lock
            if isinstance(raw, Exception):
                raise raw
            row = lock_row(_decode(key), raw, ttl if isinstance(ttl, int) else -1, now_ms)
            if foreign or row.kind != "foreign":
                rows.append(row)
    rows.sort(key=lambda row: row.key)
    return rows


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
    click.echo(f"Locks matching {match!r} on {safe_url(settings.url)}: {summary}")
    if rows:
        for line in _table([_HEADINGS, *(row.cells() for row in rows)]):
            click.echo(line)


# ------------------------------------------------------------------------------ clear


def _confirm(what: str, keys: Sequence[str], url: str) -> None:
    """Ask before deleting; a "no" or a closed stdin aborts with a non-zero status."""
    shown = "\n".join(f"  {key}" for key in keys[:_PROMPT_NAMES])
    more = f"\n  ... and {len(keys) - _PROMPT_NAMES} more" if len(keys) > _PROMPT_NAMES else ""
    click.confirm(
        f"This deletes {what} on {safe_url(url)}:\n{shown}{more}\n"
        "A task still running under a cleared lock is no longer exclusive, and there is "
        "no undo.\n(to skip this prompt use --yes)\nClear them?",
        abort=True,
        err=True,
    )


def _companion(key: str) -> str | None:
    """The waiters' signal list of lock ``key``, None when it cannot have one."""
    try:
        return companion_key(key, SIGNAL_SUFFIX)
    except ValueError:
        return None


def _clear_given(client: LockClient, settings: Settings, keys: Sequence[str], yes: bool) -> None:
    """Delete the named locks and their signal lists, after checking each is a lock.

    A key that is not a string (no lock is) and lies outside the prefix is refused, so a
    typo cannot delete broker data; then nothing at all is deleted.
    """
    unique = list(dict.fromkeys(keys))
    pipe = client.pipeline(transaction=False)
    for key in unique:
        pipe.type(key)
    types = [_decode(kind) for kind in pipe.execute()]
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
    pipe = client.pipeline(transaction=False)
    for key in present:
        pipe.delete(key)
        signal = _companion(key)
        if signal is not None:
            pipe.delete(signal)
    replies = iter(pipe.execute())
    cleared = 0
    for key in present:
        cleared += int(next(replies))
        if _companion(key) is not None:
            next(replies)
    click.echo(f"Cleared {_plural(cleared, 'lock')}.")


def _clear_all(client: LockClient, settings: Settings, yes: bool) -> None:
    """Delete every key under the prefix: locks and their signal lists."""
    pattern = prefix_pattern(settings.prefix)
    found = [_decode(key) for page in _scan(client, pattern) for key in page]
    found.sort()
    if not found:
        click.echo(f"No keys match {pattern!r}; nothing to clear.")
        return
    if not yes:
        _confirm(f"all {_plural(len(found), 'key')} matching {pattern!r}", found, settings.url)
    cleared = companions = 0
    suffix = f":{SIGNAL_SUFFIX}"
    for start in range(0, len(found), SCAN_COUNT):
        batch = found[start : start + SCAN_COUNT]
        pipe = client.pipeline(transaction=False)
        for key in batch:  # one key per DEL: safe when keys sit in different Cluster slots
            pipe.delete(key)
        for key, deleted in zip(batch, pipe.execute(), strict=True):
            if key.endswith(suffix):
                companions += int(deleted)
            else:
                cleared += int(deleted)
    extra = f" and {_plural(companions, 'signal list')}" if companions else ""
    click.echo(f"Cleared {_plural(cleared, 'lock')}{extra} matching {pattern!r}.")


@locks.command(cls=CeleryCommand)
@click.argument("keys", nargs=-1, metavar="[KEY]...")
@click.option(
    "--all",
    "clear_all",
    cls=CeleryOption,
    is_flag=True,
    help_group="Clear Options",
    help="Clear every key under the lock prefix (singleton_lock_prefix).",
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
    settings = _settings(app)
    app.loader.import_default_modules()
    if task_name not in app.tasks:
        raise _unknown_task(app, task_name)
    task = app.tasks[task_name]
    try:
        options = options_for(task)
    except ImproperlyConfigured as exc:
        raise click.ClickException(_one_line(str(exc))) from exc
    if options is None:
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
        key = task_lock_key(settings.prefix, task.name, task.run, args, kwargs, options.keys)
    except Exception as exc:  # a user's lock_keys callable may raise anything
        raise click.ClickException(
            f"lock_keys of task {task_name!r} raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    click.echo(key)

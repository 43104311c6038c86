"""What every ``celery locks`` command shares: the app and its lock settings, the lock
client, one-line errors with the exit status of a Redis failure, plain tables and the
``--json`` flag."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import click
import redis
from celery._state import get_current_app
from celery.bin.base import CeleryOption, CLIContext
from celery.exceptions import CeleryCommandException, ImproperlyConfigured
from celery.platforms import EX_UNAVAILABLE

from celery_singleton_lock.client import mask_url, redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.engine.wire import LockClient
from celery_singleton_lock.options import Settings

if TYPE_CHECKING:
    from celery import Celery


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


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


_Command = TypeVar("_Command", bound=Callable[..., object])


def json_option(group: str, text: str) -> Callable[[_Command], _Command]:
    """The ``--json`` flag of a command (its ``as_json`` argument), in help group ``group``
    with help ``text``."""
    return click.option(
        "--json", "as_json", cls=CeleryOption, is_flag=True, help_group=group, help=text
    )

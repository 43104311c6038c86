"""``celery locks clear``: delete named lock keys, or every lock matching a glob below
the prefix, after a confirmation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_singleton_lock.client import mask_url
from celery_singleton_lock.engine.wire import LockClient
from celery_singleton_lock.ops.admin import (
    clear_locks,
    decode_key,
    delete_locks,
    lock_glob,
    read_locks,
)
from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _plural,
    _redis_errors,
    _settings,
)
from celery_singleton_lock.options import Settings

if TYPE_CHECKING:
    from celery import Celery


__all__ = ["clear"]


#: How many keys a confirmation prompt names before it only counts the rest.
_PROMPT_NAMES = 10


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


@click.command(cls=CeleryCommand)
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

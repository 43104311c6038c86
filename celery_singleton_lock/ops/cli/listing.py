"""``celery locks list``: the locks under the prefix, one row per hold, with what each
run is doing and who comes next."""

from __future__ import annotations

import json
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_singleton_lock.client import mask_url
from celery_singleton_lock.engine.wire import server_time
from celery_singleton_lock.modes.lifetime import held_after_success
from celery_singleton_lock.ops.admin import (
    HEADINGS,
    LockRow,
    prefix_pattern,
)
from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _redis_errors,
    _settings,
    _table,
    json_option,
)
from celery_singleton_lock.ops.reconcile import LockState, lock_states

__all__ = ["_EXTRA", "list_locks"]


@click.command(name="list", cls=CeleryCommand)
@json_option(
    "List Options",
    "Print a JSON list of objects (lease_left in seconds) instead of a table.",
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
    if held_after_success(row.info):
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

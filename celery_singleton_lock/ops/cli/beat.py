"""``celery locks beat``: the beat group of LeaderScheduler replicas, as the lock Redis
holds it."""

from __future__ import annotations

import json

import click
from celery.bin.base import CeleryCommand, CeleryOption
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.beat.config import read_beat_settings
from celery_singleton_lock.beat.scheduler import group_key
from celery_singleton_lock.beat.state import read_group, state_name
from celery_singleton_lock.client import mask_url
from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _one_line,
    _redis_errors,
    _settings,
    _table,
    json_option,
)

__all__ = ["beat_state"]


@click.command(name="beat", cls=CeleryCommand)
@json_option(
    "Beat Options",
    "Print a JSON object (key, now, leader, replicas, slots) instead of text.",
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

"""``celery locks reap``: free the holds whose holder is proven gone, never a running
one (the proofs are :mod:`celery_singleton_lock.ops.reconcile`'s)."""

from __future__ import annotations

import contextlib

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_singleton_lock import _observe as observe
from celery_singleton_lock.ops.admin import (
    prefix_pattern,
)
from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _plural,
    _redis_errors,
    _settings,
)
from celery_singleton_lock.ops.reconcile import reap, watch_seconds

__all__ = ["reap_locks"]


@click.command(name="reap", cls=CeleryCommand)
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

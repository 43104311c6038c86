"""``celery locks limit``: set, unset and list the numbers of stacked limits
(``lock_limits``) at run time (the reading and writing are
:mod:`celery_singleton_lock.ops.limits`')."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click
from celery.bin.base import CeleryCommand

from celery_singleton_lock.client import mask_url
from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _plural,
    _redis_errors,
    _settings,
    _table,
    json_option,
)
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

__all__ = ["limit"]


@click.group(name="limit")
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
@json_option(
    "Limit Options",
    "Print a JSON list of objects (code and applies are lists) instead of a table.",
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

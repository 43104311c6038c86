"""``celery locks check``: the preflight of the lock Redis, printed, with its exit status
(the checks are :mod:`celery_singleton_lock.ops.checks`')."""

from __future__ import annotations

import json

import click
import redis
from celery.bin.base import CeleryCommand, CeleryOption
from celery.exceptions import CeleryCommandException, ImproperlyConfigured
from celery.platforms import EX_FAILURE, EX_OK

from celery_singleton_lock.config import EX_CONFIG, settings_for
from celery_singleton_lock.ops.checks import FAIL, OK, WARN, Report, run_checks
from celery_singleton_lock.ops.cli._common import (
    _app,
    _one_line,
    _plural,
    _redis_failure,
    json_option,
)

__all__ = ["check"]


_MARKS = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}


def _print_report(report: Report) -> None:
    """The report as one line per check under a heading, then a summary line."""
    mode = "scripts" if report.scripting else "plain commands"
    click.echo(f"Checking the lock Redis at {report.url} (prefix {report.prefix!r}, {mode})")
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        click.echo(f"  {_MARKS[check.status]:<4}  {check.name:<{width}}  {check.detail}")
    click.echo(f"{_plural(report.failures, 'failure')}, {_plural(report.warnings, 'warning')}")


@click.command(name="check", cls=CeleryCommand)
@json_option(
    "Check Options",
    "Print a JSON object (url, prefix, scripting, checks, failures, warnings).",
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

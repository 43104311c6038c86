"""``celery locks explain``: why a call of a task is blocked now (the reading and the
rendering are :mod:`celery_singleton_lock.ops.explain`'s)."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_singleton_lock.ops.cli._common import (
    _app,
    _client,
    _one_line,
    _redis_errors,
    _settings,
    json_option,
)
from celery_singleton_lock.ops.cli.key import (
    _fitting_kwargs,
    _json_param,
    _locked_task,
)
from celery_singleton_lock.ops.explain import explain_task, json_arguments, render

__all__ = ["explain"]


@click.command(name="explain", cls=CeleryCommand, context_settings={"ignore_unknown_options": True})
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
@json_option(
    "Explain Options",
    "Print a JSON object (key, state, holders, waiters, parked, follow_up, throttle, "
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

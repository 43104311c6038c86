"""``celery locks explain``: why a call of a task is blocked now, for operators.

The reading itself is :func:`celery_singleton_lock.explain.explain_key` (each mode's part
read and shown by its state face, :mod:`celery_singleton_lock.modes.face`); this module
resolves a task call to its key and options as a worker does, reads the arguments as the
command gets them (one JSON value per argument) and renders the result."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from celery.bin.base import CeleryCommand, CeleryOption
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.explain import MOST, Explanation, explain_key, weighed_stack
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
from celery_singleton_lock.runtime import locking_for

if TYPE_CHECKING:
    from celery import Task

__all__ = ["explain", "explain_task", "json_arguments", "render"]


def json_arguments(texts: Sequence[str]) -> list[Any]:
    """The positional arguments of a call, each given as one JSON value (``'"sku-42"'``,
    ``7``, ``'[1, 2]'``); ``ValueError`` naming the first that is not JSON."""
    values = []
    for position, text in enumerate(texts, start=1):
        try:
            values.append(json.loads(text))
        except ValueError as exc:
            raise ValueError(
                f"argument {position} ({text!r}) is not valid JSON ({exc}); give each "
                "argument as a JSON value, e.g. '\"sku-42\"' 7 (a string in double quotes)"
            ) from exc
    return values


def explain_task(
    task: Task[Any, Any], args: Sequence[Any], kwargs: dict[str, Any], *, most: int = MOST
) -> Explanation:
    """Why a call of ``task`` with these arguments would be blocked now: its key (as the
    worker computes it, with the task's effective options), read from the lock Redis.
    ``ImproperlyConfigured`` when the task is not locked."""
    locking = locking_for(task)
    if locking is None:
        raise ImproperlyConfigured(
            f"task {task.name!r} is not locked: it is not a LockedTask and no "
            "singleton_lock_tasks glob matches it"
        )
    key = locking.key(list(args), kwargs)
    client = locking.client(task.app)
    stack, weight_error = weighed_stack(locking, list(args), kwargs)
    return explain_key(
        client,
        key,
        locking.options,
        task=task.name,
        most=most,
        stack=stack,
        weight_error=weight_error,
    )


def render(explanation: Explanation, *, as_json: bool = False) -> str:
    """The explanation as ``celery locks explain`` prints it: text, or (``as_json``) the
    JSON object of :meth:`Explanation.as_json`."""
    if as_json:
        return json.dumps(explanation.as_json(), indent=2)
    return str(explanation)


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

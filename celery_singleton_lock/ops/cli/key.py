"""``celery locks key``: the lock key of a task call, computed as a worker computes it;
and reading a call's task and arguments from the command line (``explain`` reads them the
same way)."""

from __future__ import annotations

import difflib
import inspect
import json
from typing import TYPE_CHECKING, Any

import click
from celery.bin.base import CeleryCommand
from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.ops.cli._common import (
    _app,
    _one_line,
    _settings,
)
from celery_singleton_lock.runtime import locking_for

if TYPE_CHECKING:
    from celery import Celery

    from celery_singleton_lock.runtime import TaskLocking

__all__ = ["key_for"]


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


def _locked_task(
    app: Celery, task_name: str, *, hint: str | None = None
) -> tuple[Any, TaskLocking]:
    """The task named ``task_name`` (the app's modules imported) and its locking; a click
    error naming what is wrong (unknown, badly configured, or not locked; ``hint``: the
    parameter an unknown name is reported against)."""
    app.loader.import_default_modules()
    if task_name not in app.tasks:
        unknown = _unknown_task(app, task_name)
        if hint is not None:
            unknown.param_hint = hint
        raise unknown
    task = app.tasks[task_name]
    try:
        locking = locking_for(task)
    except ImproperlyConfigured as exc:
        raise click.ClickException(_one_line(str(exc))) from exc
    if locking is None:
        raise click.ClickException(
            f"task {task_name!r} is not locked: it is not a LockedTask and no "
            "singleton_lock_tasks glob matches it"
        )
    return task, locking


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


def _fitting_kwargs(
    task_name: str, func: Any, args: list[Any], kwargs: dict[str, Any], lock_keys: object
) -> dict[str, Any]:
    """``kwargs`` of a call that fits the task's signature, so the key printed is the one a
    real call uses; ``BadParameter`` (exit status 2) when the arguments do not fit.

    The only arguments that may be left out are required ones that ``lock_keys`` does not
    name (or every one, under ``lock_keys=()``): they do not take part in the key, so they
    are filled with None here, and a note on stderr says so.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return kwargs  # no introspectable signature: keys.py binds what it can
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        problem = str(exc)
    else:
        return kwargs
    empty = inspect.Parameter.empty
    shown = signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )
    hint = (
        f"these arguments do not fit {task_name}{shown}: {problem}; a call with them "
        "fails, so no call uses the key they would give"
    )
    try:
        partial = signature.bind_partial(*args, **kwargs)
    except TypeError:
        raise click.BadParameter(hint, param_hint="ARGS_JSON / KWARGS_JSON") from None
    missing = [
        name
        for name, parameter in signature.parameters.items()
        if name not in partial.arguments
        and parameter.default is inspect.Parameter.empty
        and parameter.kind
        in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    named = tuple(lock_keys) if isinstance(lock_keys, (list, tuple)) else None
    if not missing or named is None or any(name in named for name in missing):
        raise click.BadParameter(
            f"{hint} (give every argument: the key depends on "
            f"{'the missing ones' if missing else 'all of them'})",
            param_hint="ARGS_JSON / KWARGS_JSON",
        )
    click.echo(
        f"note: {', '.join(missing)} left out: lock_keys={list(named)!r} does not use "
        f"{'it' if len(missing) == 1 else 'them'}, so every call with these arguments has "
        "this key",
        err=True,
    )
    return {**kwargs, **dict.fromkeys(missing)}


@click.command(name="key", cls=CeleryCommand)
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
    _settings(app)
    task, locking = _locked_task(app, task_name)
    kwargs = _fitting_kwargs(task_name, task.run, args, kwargs, locking.options.keys)
    try:
        key = locking.key(args, kwargs)
    except Exception as exc:  # a user's lock_keys callable may raise anything
        raise click.ClickException(
            f"lock_keys of task {task_name!r} raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    click.echo(key)

"""``celery locks explain``: why a call of a task is blocked, for operators.

The reading itself is :func:`celery_singleton_lock.explain.explain_key` (each mode's part
read and shown by its state face, :mod:`celery_singleton_lock.modes.face`); this module
resolves a task call to its key and options as a worker does, reads the arguments as the
command gets them (one JSON value per argument) and renders the result.
The explanation's types are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.explain import (
    MOST,
    Burst,
    Explanation,
    FollowUp,
    Handed,
    Held,
    Parked,
    Throttle,
    Waiter,
    explain_key,
    weighed_stack,
)
from celery_singleton_lock.runtime import locking_for

if TYPE_CHECKING:
    from celery import Task

__all__ = [
    "Burst",
    "Explanation",
    "FollowUp",
    "Handed",
    "Held",
    "Parked",
    "Throttle",
    "Waiter",
    "explain_task",
    "json_arguments",
    "render",
]


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

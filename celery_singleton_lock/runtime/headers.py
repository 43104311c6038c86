"""What travels with a locked task's messages: header and ``apply_async`` option names, and
reading them back in a run.

A queue-scope publish names its key in the message (``singleton_lock_key``), so the run
locks exactly what the producer locked; per-call ``lock_*`` options travel as a header too.
Retries the lock layer asks for are published past the queue lock (``REPUBLISH_OPTION``).
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.options import TASK_OPTION_PREFIX, validate_task_options

__all__ = [
    "HEADER_DUPLICATE",
    "HEADER_KEY",
    "HEADER_LOCK_RETRIES",
    "HEADER_OPTIONS",
    "PUBLISH_WAIT_OPTION",
    "REPUBLISH_OPTION",
    "carried_options",
    "header",
    "header_key",
    "pop_call_options",
]

#: Message header carrying the ``lock_*`` options given to one call.
HEADER_OPTIONS = "singleton_lock_options"
#: Message header that carries a queue-scope lock's key from the producer to the run.
HEADER_KEY = "singleton_lock_key"
#: Header of a message republished because an earlier delivery of it held the lock (for
#: operators reading a message; every queue-scope delivery checks whether its task id
#: already finished).
HEADER_DUPLICATE = "singleton_lock_duplicate"
#: Message header counting the retries the lock layer asked for (a busy key, an outage, an
#: earlier delivery holding it): they do not count against the task's ``max_retries`` and
#: leave ``request.retries`` alone, but they make the run "the work itself".
HEADER_LOCK_RETRIES = "singleton_lock_retries"
#: ``apply_async`` option of a retry that the lock layer itself asks for (the lock was
#: busy or unreachable): publish it as it is (its value: headers to add), never blocked or
#: lost on the queue lock.
REPUBLISH_OPTION = "singleton_lock_republish"
#: ``apply_async`` option: seconds a queue-scope publish waits for a busy lock before it
#: counts as a duplicate (None: no limit); 0, the default, does not wait.
PUBLISH_WAIT_OPTION = "singleton_lock_publish_wait"


def header(request: Any, name: str) -> Any:
    """A header of the message being run, wherever Celery put it: a run's request has
    headers as attributes, an eager run keeps them in ``request.headers``, and the worker's
    own ``Request`` of a message (what ``task_revoked`` gives) in ``request_dict``."""
    value = getattr(request, name, None)
    for where in ("headers", "request_dict"):
        if value is not None:
            break
        found = getattr(request, where, None)
        value = found.get(name) if isinstance(found, dict) else None
    return value


def header_key(request: Any) -> str | None:
    """The queue-scope key carried by the message."""
    value = header(request, HEADER_KEY)
    return str(value) if value else None


def carried_options(request: Any, task_name: str) -> dict[str, Any]:
    """The per-call ``lock_*`` options the message carries, validated."""
    carried = header(request, HEADER_OPTIONS)
    if not carried:
        return {}
    return validate_task_options(carried, f"message options of task {task_name!r}")


def pop_call_options(task_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Take the ``lock_*`` options out of one call's ``apply_async`` options, validated
    (an unknown name is ImproperlyConfigured with a suggestion)."""
    given = {
        name: options.pop(name) for name in list(options) if name.startswith(TASK_OPTION_PREFIX)
    }
    if not given:
        return {}
    if callable(given.get("lock_keys")):
        raise ImproperlyConfigured(
            f"task {task_name!r}: a per-call lock_keys must be a list of parameter names "
            "(a callable cannot travel with the message)"
        )
    return validate_task_options(given, f"apply_async of task {task_name!r}")

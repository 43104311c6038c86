"""The record that makes a skipped duplicate queryable afterwards (``skip_info(result)``),
kept beside the lock keys, and the worker event of a skip."""

from __future__ import annotations

import datetime
import json
import logging
import time
from typing import Any

from celery_singleton_lock._observe.emit import worker_event
from celery_singleton_lock._observe.objects import SKIPPED_EVENT
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.exceptions import LockBackendError

log = logging.getLogger("celery_singleton_lock.task")

#: How long the record of a skip is kept when the app sets no ``result_expires``.
_DEFAULT_RECORD_TTL = 86400.0


def skip_record_key(prefix: str, task_id: str) -> str:
    """Where the record of the skipped run ``task_id`` is kept: beside the lock keys, but
    outside ``prefix:*``, so ``locks list`` and ``clear_locks`` never see it."""
    return f"{prefix}~skipped:{task_id}"


def _record_ttl(app: Any) -> float:
    """Seconds a skip record lives: as long as the app keeps task results."""
    expires = app.conf.get("result_expires")
    if isinstance(expires, datetime.timedelta):
        expires = expires.total_seconds()
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires > 0:
        return float(expires)
    return _DEFAULT_RECORD_TTL


def skipped(
    task: Any,
    client: Any,
    *,
    prefix: str,
    key: str,
    task_id: str,
    holder_task_id: str | None,
    reason: str = "held",
    explanation: dict[str, Any] | None = None,
) -> None:
    """A duplicate run of ``task`` was skipped: keep a record of it (read back with
    ``skip_info(result)``) and, from a worker, send the ``task-lock-skipped`` event. A
    run skipped because its key was throttled (``reason="throttled"``) is recorded the
    same way; its event is ``task-lock-throttled``, sent by :func:`throttled`.
    ``explanation`` (why the key blocked, as ``Explanation.as_json()`` gives it) is kept
    in the record too."""
    record = {
        "key": key,
        "holder_task_id": holder_task_id,
        "task": task.name,
        "at": time.time(),
        "reason": reason,
        "explanation": explanation,
    }
    try:
        call(
            key,
            client.set,
            skip_record_key(prefix, task_id),
            json.dumps(record, sort_keys=True),
            px=max(1, int(_record_ttl(task.app) * 1000)),
        )
    except LockBackendError as exc:
        log.warning("%s[%s]: could not record the skip: %s", task.name, task_id, exc)
    if reason == "held":
        worker_event(task, task_id, SKIPPED_EVENT, key=key, holder_task_id=holder_task_id)

"""The Celery runtime: what happens when a locked task runs (:mod:`.run`) or is published
(:mod:`.publish`), shared by ``LockedTask`` and by tasks locked through
``singleton_lock_tasks``; how a task locks (:mod:`.locking`), the end of a run
(:mod:`.finish`) and runs that can no longer release (:mod:`.lost`). What differs between
modes lives in :mod:`celery_singleton_lock.modes`."""

from __future__ import annotations

from celery_singleton_lock.modes.scope import queue_token
from celery_singleton_lock.runtime.context import current_lock
from celery_singleton_lock.runtime.finish import release_after_run
from celery_singleton_lock.runtime.headers import (
    HEADER_DUPLICATE,
    HEADER_KEY,
    PUBLISH_WAIT_OPTION,
    header_key,
)
from celery_singleton_lock.runtime.locking import (
    FOREIGN_ALLOWED,
    LOCKED_MARKER,
    TaskLocking,
    lock_key_method,
    locking_for,
    wire_form,
)
from celery_singleton_lock.runtime.lost import (
    received_request,
    release_for_dropped_message,
    release_for_lost_run,
    remember_delivery,
)
from celery_singleton_lock.runtime.publish import locked_apply_async
from celery_singleton_lock.runtime.run import body_of, locked_call
from celery_singleton_lock.runtime.sweep import Sweeper, sweep

__all__ = [
    "FOREIGN_ALLOWED",
    "HEADER_DUPLICATE",
    "HEADER_KEY",
    "LOCKED_MARKER",
    "PUBLISH_WAIT_OPTION",
    "Sweeper",
    "TaskLocking",
    "body_of",
    "current_lock",
    "header_key",
    "lock_key_method",
    "locked_apply_async",
    "locked_call",
    "locking_for",
    "queue_token",
    "received_request",
    "release_after_run",
    "release_for_dropped_message",
    "release_for_lost_run",
    "remember_delivery",
    "sweep",
    "wire_form",
]

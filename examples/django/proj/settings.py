"""The Celery and celery-singleton-lock part of a Django ``settings.py``.

Paste the block below into your project's settings. With
``app.config_from_object("django.conf:settings", namespace="CELERY")`` (see ``celery.py``)
each name is the plugin's setting in upper case with the ``CELERY_`` prefix:
``singleton_lock_url`` → ``CELERY_SINGLETON_LOCK_URL``. Values are checked when a worker
starts; a bad one raises ``ImproperlyConfigured`` naming the setting as written here.
"""

from __future__ import annotations

import os

# -- Celery -----------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
CELERY_TASK_ACKS_LATE = False

# -- celery-singleton-lock ----------------------------------------------------------------
# The Redis holding the locks (default: the broker's URL when it is a Redis one).
CELERY_SINGLETON_LOCK_URL = os.environ.get("SINGLETON_LOCK_URL", "redis://localhost:6379/1")
# Prefix of every lock key, so the locks of several projects can share one Redis.
CELERY_SINGLETON_LOCK_PREFIX = "shop-locks"
# Default lease in seconds; renewed while a task runs, so a crashed worker's lock frees
# within one lease while a healthy task may run far longer.
CELERY_SINGLETON_LOCK_TIMEOUT = 60
# What a task does when its lock is held: "skip" (default), "wait", "retry" or "raise".
CELERY_SINGLETON_LOCK_ON_CONFLICT = "skip"
# Hold locks while the body runs ("run", default) or from enqueue to the end ("queue").
CELERY_SINGLETON_LOCK_SCOPE = "run"
CELERY_SINGLETON_LOCK_RENEW = True
# Lock tasks you do not own (no base=LockedTask): task-name glob -> lock_* options.
CELERY_SINGLETON_LOCK_TASKS = {
    "billing.tasks.charge_*": {"lock_keys": ["invoice_id"], "lock_on_conflict": "wait"},
    "reports.tasks.rebuild_*": {"lock_keys": [], "lock_scope": "queue"},
}
# With Redis unreachable: False (default) retries the task rather than run it unlocked.
CELERY_SINGLETON_LOCK_FAIL_OPEN = False

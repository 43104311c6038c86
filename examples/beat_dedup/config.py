"""Settings the worker and both beats share, read from the environment.

``REDIS_URL`` (broker and locks), ``BEAT_DEDUP_NAMESPACE`` (queue and key prefix, default
``beat_dedup``), ``BEAT_DEDUP_JOB_SECONDS`` (how long a run takes, 3) and
``BEAT_DEDUP_EVERY`` (the beat period, 1 s). No tasks here: the by-name beat imports this
module and must not learn the task module from it.
"""

from __future__ import annotations

import os
from typing import Any

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = os.environ.get("BEAT_DEDUP_NAMESPACE", "beat_dedup")
JOB_SECONDS = float(os.environ.get("BEAT_DEDUP_JOB_SECONDS", "3"))
EVERY = float(os.environ.get("BEAT_DEDUP_EVERY", "1"))


def celery_settings(namespace: str = NAMESPACE, redis_url: str = REDIS_URL) -> dict[str, Any]:
    """The settings both beat apps and the worker share (the same broker and queue)."""
    return {
        "broker_url": redis_url,
        "broker_transport_options": {"global_keyprefix": f"{namespace}:"},
        "broker_connection_retry_on_startup": True,
        "task_default_queue": namespace,
        "task_ignore_result": True,
        "worker_prefetch_multiplier": 1,
        "worker_enable_remote_control": False,
        "singleton_lock_url": redis_url,
        "singleton_lock_prefix": f"{namespace}:lock",
    }

"""The ``RedisLock`` of one task run, which counts its renewals and sends
``lock_renewed`` (the runtime builds it; the emitters read what it recorded)."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock._observe.objects import emit, lock_renewed
from celery_singleton_lock.engine.lock import RedisLock


class RunLock(RedisLock):
    """The ``RedisLock`` of one task run, with what the signals report: when the hold began,
    its fencing token, and how many times its lease was extended (by the renewer or by the
    task's own ``extend()`` calls)."""

    task: Any = None
    task_id: str | None = None
    acquired_at: float | None = None
    held_token: int | None = None
    renewals: int = 0
    lost_reported: bool = False

    def _renewed(self) -> None:
        """The lease was extended (by the renewer or by ``extend()``): count it, send
        ``lock_renewed``."""
        self.renewals += 1
        if self.task is not None:
            emit(
                lock_renewed,
                self.task,
                key=self.name,
                task_id=self.task_id,
                fencing_token=self.held_token,
            )

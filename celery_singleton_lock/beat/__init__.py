"""Beat with replicas: several ``celery beat`` processes, one leader, each schedule slot
sent once. Run each replica with ``celery beat -S celery_singleton_lock.beat:LeaderScheduler``
(see docs/beat.md). A task learns the slot it was sent for with :func:`scheduled_slot`."""

from __future__ import annotations

from celery_singleton_lock.beat.scheduler import HEADER, BeatConfigError, LeaderScheduler
from celery_singleton_lock.beat.state import BeatSlot, scheduled_slot

__all__ = ["HEADER", "BeatConfigError", "BeatSlot", "LeaderScheduler", "scheduled_slot"]

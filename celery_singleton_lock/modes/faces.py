"""The registry of state faces (:mod:`.face`): every mode that keeps state beside a lock
key shows it in an explanation through one line here, in the order the explanation lists
the parts (its JSON fields, text lines and states follow this order).

The lock's own part (:class:`.holders.HoldersFace`: holders, slots, waiters) comes first.
"""

from __future__ import annotations

from celery_singleton_lock.modes.burst import BurstFace
from celery_singleton_lock.modes.face import Face
from celery_singleton_lock.modes.held import LimitsFace
from celery_singleton_lock.modes.holders import HoldersFace
from celery_singleton_lock.modes.parking import ParkFace
from celery_singleton_lock.modes.pending import FollowUpFace
from celery_singleton_lock.modes.starts import StartsFace

__all__ = ["FACES"]

#: The faces an explanation runs, in order.
FACES: tuple[Face, ...] = (
    HoldersFace(),  # the lock's own: holders, slots, waiters
    ParkFace(),  # park: parked and handed calls
    FollowUpFace(),  # coalesce, replace: the pending follow-up
    StartsFace(),  # lock_rate_limit: the starts in the window
    BurstFace(),  # lock_debounce: the open burst
    LimitsFace(),  # lock_limits: the stacked limits of the call
)

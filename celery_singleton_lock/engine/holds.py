"""One hold of a lock: what a successful acquire gave this process. Imports nothing but the
standard library."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Hold"]


@dataclass(eq=False)
class Hold:
    """One successful acquire: the owner token it holds under, what the server granted,
    and what this process knows about its lease. ``ended`` once released or detached."""

    token: str
    fence: int
    thread: threading.Thread
    expires_at: float  # local monotonic lower bound of the lease end (last confirmed lease)
    key: str  # the lock key, or the slot it holds (limit > 1)
    reserved: bool = False  # holds the instance's local reservation (a fixed ``token``)
    lost: bool = False
    ended: bool = False

    def lost_by(self, now: float) -> bool:
        """Whether the hold can no longer be trusted at monotonic ``now``: a renewal found
        the lock gone, or the last confirmed lease has run out (``lease_lost``)."""
        return self.lost or now >= self.expires_at

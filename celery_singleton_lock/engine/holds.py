"""One hold of a lock: what a successful acquire gave this process. Imports nothing but the
standard library."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Hold", "HoldView"]


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


class HoldView:
    """What a lock instance says about "the hold this call is about" (the calling thread's,
    or task's, as its ``_hold()`` finds it), shared by the threaded and the asyncio lock."""

    name: str
    _fixed_token: str | None

    def _hold(self) -> Hold | None:
        raise NotImplementedError

    @property
    def token(self) -> str | None:
        """The owner token of the hold this call is about, else the fixed ``token``."""
        hold = self._hold()
        return hold.token if hold is not None else self._fixed_token

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the hold this call is about (None when not held)."""
        hold = self._hold()
        return hold.fence if hold is not None else None

    @property
    def held_key(self) -> str:
        """The key the hold this call is about holds: the lock key, or with slots the slot
        taken (the lock key when not held)."""
        hold = self._hold()
        return hold.key if hold is not None else self.name

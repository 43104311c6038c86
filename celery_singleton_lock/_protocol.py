"""The seam between ``RedisLock`` and the wire: one small interface, two protocols.

``RedisLock`` decides *when* to acquire, wait, extend and release; a :class:`Protocol` makes
the single round trip (or the WATCH transaction) that does it. ``_scripted`` runs the Lua
scripts of ``_scripts``; ``_plain`` runs the classic SETNX / GET / GETSET commands for
servers where EVAL is disabled. Both write and read the same value (``_value``), so locks of
either mode exclude each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from celery_singleton_lock._redis import LockClient, call, server_time

__all__ = ["SIGNAL_TTL_MS", "Attempt", "Protocol", "grace_ms"]

#: How long a wake-up pushed onto the waiters' signal list survives unread.
SIGNAL_TTL_MS = 2000
#: The key outlives its lease by this much plus a tenth of the lease, so an abandoned key
#: vanishes on its own a little after the lease (the value, not the TTL, decides "held").
GRACE_BASE_MS = 1000
GRACE_FRACTION = 10


def grace_ms(lease_ms: int) -> int:
    """How long the key outlives a lease of ``lease_ms``."""
    return GRACE_BASE_MS + lease_ms // GRACE_FRACTION


class Attempt(NamedTuple):
    """The outcome of one acquire attempt: ``acquired`` with the hold's fencing token in
    ``number``, or not, with the milliseconds until the current holder's lease ends."""

    acquired: bool
    number: int


class Protocol(ABC):
    """How one lock talks to Redis. ``name`` is the lock key, ``signal_key`` the waiters'
    wake-up list in the same hash slot, ``info`` the holder info stored in the value."""

    def __init__(self, client: LockClient, name: str, signal_key: str, info: str) -> None:
        self.client = client
        self.name = name
        self.signal_key = signal_key
        self.info = info

    @abstractmethod
    def acquire(self, token: str, lease_ms: int, mode: bytes, claim: str = "") -> Attempt:
        """One try. ``mode``: b"1" after waiting, b"0" for a first blocking try, b"x" for a
        non-blocking try (which asks nobody to wake it). A hold under the owner token
        ``claim`` (when not empty) is taken over as if it were ours."""

    @abstractmethod
    def release(self, token: str) -> int:
        """Owner-checked delete: 0 not owned (nothing done), 1 released, 2 released and a
        waiter was signalled."""

    @abstractmethod
    def extend(self, token: str, lease_ms: int) -> int:
        """Owner-checked new lease end (server now + ``lease_ms``): the expiry in server
        milliseconds, or 0 when not owned (nothing done)."""

    def server_time(self) -> tuple[int, int]:
        """The clock of the server that holds the key, as (milliseconds, microseconds)."""
        return call(self.name, server_time, self.client, self.name)

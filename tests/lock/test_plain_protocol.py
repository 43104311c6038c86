"""The plain-command protocol's races, replayed with a real rival between its steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine.plain import PlainProtocol
from celery_singleton_lock.engine.value import format_value


class Stepping(PlainProtocol):
    """The plain protocol, letting a rival act at a named step, once."""

    at = ""
    rival: Callable[[], Any] = staticmethod(lambda: None)
    done = False

    def step(self, where: str) -> None:
        if where == self.at and not self.done:
            self.done = True
            self.rival()


def Interleaved(  # noqa: N802 - reads like the lock class it builds
    client: redis.Redis,
    key: str,
    *,
    at: str,
    rival: Callable[[], Any] | None,
    protocol: type[Stepping] = Stepping,
    **kwargs: Any,
) -> RedisLock:
    """A plain-mode lock whose protocol lets ``rival`` act at step ``at``."""
    lock = RedisLock(client, key, scripting=False, **kwargs)
    stepping = protocol(lock.client, lock.name, lock.signal_key, lock.holder_info)
    stepping.at = at
    stepping.rival = rival or (lambda: None)  # type: ignore[method-assign]
    lock.protocol = stepping
    return lock


def _stale(client: redis.Redis, key: str) -> None:
    expired = int(client.time()[0]) * 1000 - 500
    client.set(key, format_value(expired, False, "crashed", 7, ""), px=5000)


def test_get_nil_goes_back_to_setnx(client: redis.Redis, key: str) -> None:
    """The holder releases between our failed SETNX and our GET: GET is nil, so we retry
    SETNX (not the expiry path) and win."""
    holder = RedisLock(client, key, timeout=10, scripting=False)
    assert holder.acquire()
    lock = Interleaved(client, key, timeout=10, at="after-setnx", rival=holder.release)
    assert lock.acquire(blocking=False)
    assert lock.owned()


def test_lost_getset_race_leaves_the_winner_owning(client: redis.Redis, key: str) -> None:
    """Two clients see the same expired value; the rival takes it over first. Our GETSET
    must not go through, and the rival must still own (and be able to release) the lock."""
    _stale(client, key)
    rival = RedisLock(client, key, timeout=10, scripting=False)
    lock = Interleaved(
        client, key, timeout=10, at="before-getset", rival=lambda: rival.acquire(blocking=False)
    )
    assert not lock.acquire(blocking=False)
    assert rival.owned()
    assert not lock.owned()
    rival.release()
    assert not rival.locked()


def test_key_deleted_before_getset_is_won_without_clobbering(client: redis.Redis, key: str) -> None:
    """The expired key vanishes just before our take-over: we end up owning a fresh lock."""
    _stale(client, key)
    lock = Interleaved(
        client, key, timeout=10, at="before-getset", rival=lambda: client.delete(key)
    )
    assert lock.acquire(blocking=False)
    assert lock.owned()
    assert (lock.fencing_token or 0) > 7


def test_fence_stays_ahead_of_a_hold_that_fit_between_time_and_setnx(
    client: redis.Redis, key: str
) -> None:
    """A whole rival hold (acquire and release) that happens after our TIME but before our
    SETNX got a later clock reading than ours; our fencing token must still exceed its."""
    rival_tokens: list[int] = []

    def rival_hold() -> None:
        rival = RedisLock(client, key, timeout=10)
        assert rival.acquire(blocking=False)
        rival_tokens.append(rival.fencing_token or 0)
        rival.release()

    class Late(Stepping):
        def server_time(self) -> tuple[int, int]:
            reading = super().server_time()
            if not self.done:
                self.done = True
                rival_hold()  # between our TIME and our SETNX
            return reading

    lock = Interleaved(client, key, timeout=10, at="never", rival=None, protocol=Late)
    assert lock.acquire(blocking=False)
    assert rival_tokens
    assert (lock.fencing_token or 0) > rival_tokens[0]


def test_a_foreign_value_that_expires_between_get_and_pttl_is_free_not_foreign(
    client: redis.Redis, key: str
) -> None:
    """A foreign value with a TTL is read by GET and gone by the PTTL that asks how long it
    has left (it expired in between; here a rival deletes it at that step). The key is free:
    the acquire starts over and wins, and never reports a foreign value with no TTL."""
    client.set(key, "not ours", px=60_000)
    lock = Interleaved(client, key, timeout=10, at="after-get", rival=lambda: client.delete(key))
    assert lock.acquire(blocking=False)
    assert lock.owned()

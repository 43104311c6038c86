"""Calls held back until they fit (``modes.held``), at the level of their scripts on a real
redis-server: a call that does not fit in its stacked limits is kept under the stack's base
with its place in the lines, a release of a share wakes the workers' sweep, the sweep hands
the call out once it fits (and again if it never starts), and a call held for its window
is due at its time. Times are the server's; where a test needs one to have passed, it sets
it in the data rather than sleeping."""

from __future__ import annotations

import uuid

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.stack import (
    HELD,
    HELD_CALLS,
    HELD_OUT,
    HELD_WAKE,
    Limit,
    Stack,
    stack_base,
)

KEEP = 600_000
#: A restart delay no test reaches: a call handed out stays out.
NEVER = 3_600_000


@pytest.fixture
def prefix() -> str:
    """An application prefix no other test uses (its stack keys are its own)."""
    return f"hd{uuid.uuid4().hex[:8]}"


def _stack(prefix: str, weight: int, in_all: int = 4) -> Stack:
    return Stack(stack_base(prefix), (Limit("global", "global", in_all),), weight)


def _lock(client: redis.Redis, prefix: str, job: str, weight: int, **kwargs: object) -> RedisLock:
    name = f"{prefix}:job:{job}:{{{prefix}:stack}}"
    return RedisLock(client, name, timeout=30, stack=_stack(prefix, weight), **kwargs)  # type: ignore[arg-type]


def _hold_back(client: redis.Redis, prefix: str, task_id: str, weight: int,
               task: str = "proj.job") -> str | None:  # fmt: skip
    """Hold back the call ``task_id`` of weight ``weight`` (its place token: ``P<task id>``)."""
    return atomic.held_park(
        client, stack_base(prefix), task_id, key=_lock(client, prefix, task_id, weight).name,
        payload=f"{task}\ncall {task_id}".encode(), keep_ms=KEEP,
        stack=_stack(prefix, weight), place=f"P{task_id}", place_ms=KEEP,
    )  # fmt: skip


def _sweep(client: redis.Redis, prefix: str, *, restart_ms: int = NEVER,
           tasks: tuple[str, ...] = ()) -> atomic.HeldSweep:  # fmt: skip
    return atomic.held_sweep(client, stack_base(prefix), restart_ms=restart_ms, place_ms=KEEP,
                             travel_ms=KEEP, most=100, tasks=tasks)  # fmt: skip


def _line(client: redis.Redis, prefix: str) -> list[bytes]:
    return client.zrange(stack_base(prefix) + "line:global", 0, -1)  # type: ignore[return-value]


def test_a_call_that_does_not_fit_is_held_until_a_release_makes_room(
    client: redis.Redis, prefix: str
) -> None:
    """Weight 3 holds 3 of 4: a weight-2 call is held back by "global", keeping its place in
    that limit's line; a sweep leaves it (it still does not fit). The holder's release
    wakes the sweep (one element on the wake list), and the sweep then hands the call out,
    with its key and call, once; when it starts, nothing of it is left."""
    base = stack_base(prefix)
    holder = _lock(client, prefix, "holder", 3)
    assert holder.acquire(blocking=False)
    assert _hold_back(client, prefix, "c1", 2) == "global"
    assert _line(client, prefix) == [b"2:Pc1"]
    assert client.zrange(base + HELD, 0, -1) == [b"c1"]
    swept = _sweep(client, prefix)
    assert swept.active
    assert swept.calls == []
    assert client.llen(base + HELD_WAKE) == 0
    holder.release()
    assert client.llen(base + HELD_WAKE) == 1
    swept = _sweep(client, prefix)
    assert swept.calls == [
        atomic.HeldCall("c1", _lock(client, prefix, "c1", 2).name, b"proj.job\ncall c1")
    ]
    assert client.zrange(base + HELD_OUT, 0, -1) == [b"c1"]
    assert _sweep(client, prefix).calls == []  # handed out once
    assert atomic.held_started(client, base, "c1")
    assert not _sweep(client, prefix).active
    assert client.exists(base + HELD, base + HELD_CALLS, base + HELD_OUT) == 0
    assert _line(client, prefix) == []


def test_a_call_that_fits_now_is_not_held(client: redis.Redis, prefix: str) -> None:
    """With room in every limit, nothing is kept: the caller tries again at once."""
    assert _hold_back(client, prefix, "c1", 2) is None
    base = stack_base(prefix)
    assert client.exists(base + HELD, base + HELD_CALLS, base + "line:global") == 0


def test_a_held_call_is_not_passed_by_a_lighter_newcomer(client: redis.Redis, prefix: str) -> None:
    """A holds 2, B 1 (3 of 4); a weight-2 call H is held back. B ends: there is room for H
    (2 + 2), and a weight-1 newcomer that came after H does not get in (2 + 1, with the 2
    of H ahead of it in the line). The sweep hands H out; H, claiming with its place token,
    takes its share and its place; then the newcomer still waits for room."""
    a, b = _lock(client, prefix, "a", 2), _lock(client, prefix, "b", 1)
    assert a.acquire(blocking=False)
    assert b.acquire(blocking=False)
    assert _hold_back(client, prefix, "h", 2) == "global"
    b.release()
    newcomer = _lock(client, prefix, "n", 1)
    assert not newcomer.acquire(blocking=False)
    assert newcomer.held_back_by == "global"
    assert [call.task_id for call in _sweep(client, prefix).calls] == ["h"]
    assert not newcomer.acquire(blocking=False)  # h's place is kept while it travels
    h = _lock(client, prefix, "h", 2, claim="Ph")
    assert h.acquire(blocking=False)
    assert atomic.held_started(client, stack_base(prefix), "h")
    assert _line(client, prefix) == []
    assert not newcomer.acquire(blocking=False)  # 2 + 2: full
    a.release()
    assert newcomer.acquire(blocking=False)
    for held in (h, newcomer):
        held.release()


def test_a_call_handed_out_that_never_starts_is_handed_out_again(
    client: redis.Redis, prefix: str
) -> None:
    """A call handed out stays out while its restart delay has not passed; once it has (a
    restart delay of 0: handed out at or before the server's now), the next sweep hands it
    out again, its call kept."""
    holder = _lock(client, prefix, "holder", 3)
    assert holder.acquire(blocking=False)
    assert _hold_back(client, prefix, "c1", 2) == "global"
    holder.release()
    assert [call.task_id for call in _sweep(client, prefix).calls] == ["c1"]
    assert _sweep(client, prefix).calls == []
    again = _sweep(client, prefix, restart_ms=0).calls
    assert [(call.task_id, call.payload) for call in again] == [("c1", b"proj.job\ncall c1")]


def test_a_call_held_for_its_window_is_due_at_its_time(client: redis.Redis, prefix: str) -> None:
    """A call held back by its rate for 60 s is not handed out before then, and the sweep
    says when it is due; with its due time moved to the past (as the server's clock will
    be), it is handed out, whatever its limits (it has none)."""
    base = stack_base(prefix)
    kept = atomic.held_park(client, base, "w1", key=f"{prefix}:job:w", payload=b"proj.job\nw1",
                            keep_ms=KEEP, due_ms=60_000)  # fmt: skip
    assert kept == ""
    swept = _sweep(client, prefix)
    assert swept.calls == []
    assert swept.next_due is not None
    assert 50 < swept.next_due <= 60
    assert client.llen(base + HELD_WAKE) == 1  # a sweep learns the new due time at once
    client.zadd(base + HELD, {"w1": 0})
    swept = _sweep(client, prefix)
    assert [(call.task_id, call.key) for call in swept.calls] == [("w1", f"{prefix}:job:w")]
    assert swept.next_due is None


def test_a_sweep_hands_out_only_the_calls_of_its_tasks(client: redis.Redis, prefix: str) -> None:
    """A worker that does not know a held call's task leaves it for one that does."""
    holder = _lock(client, prefix, "holder", 3)
    assert holder.acquire(blocking=False)
    assert _hold_back(client, prefix, "c1", 2, task="other.job") == "global"
    holder.release()
    swept = _sweep(client, prefix, tasks=("proj.job",))
    assert swept.calls == []
    assert swept.active
    assert [call.task_id for call in _sweep(client, prefix, tasks=("other.job",)).calls] == ["c1"]


def test_a_release_wakes_the_sweep_only_when_calls_are_held(
    client: redis.Redis, prefix: str
) -> None:
    """A release with nobody in the lines, or with no call held, pushes no wake-up; with a
    call held, one wake-up, and no second one while the first is unread."""
    base = stack_base(prefix)
    first = _lock(client, prefix, "first", 1)
    assert first.acquire(blocking=False)
    first.release()
    assert client.exists(base + HELD_WAKE) == 0
    holders = [_lock(client, prefix, f"h{i}", 1) for i in range(4)]
    assert all(held.acquire(blocking=False) for held in holders)
    assert _hold_back(client, prefix, "c1", 1) == "global"
    holders[0].release()
    holders[1].release()
    assert client.lrange(base + HELD_WAKE, 0, -1) == [b"1"]
    for held in holders[2:]:
        held.release()

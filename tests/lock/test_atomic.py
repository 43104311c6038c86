"""The typed wrappers of the modes' scripts (``engine.atomic``) on a real redis-server: each
one admitted or refused, owned or not owned, and what it leaves at the keys."""

from __future__ import annotations

import json
import time

import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import (
    DEBOUNCE,
    HANDED,
    PENDING,
    STARTS,
    companion_key,
)
from celery_singleton_lock.engine.value import parse_value


def _pending(task_id: str, body: bytes = b"[[1], {}]") -> atomic.Pending:
    return atomic.Pending(task_id, f"q-{task_id}", json.dumps({"task_id": task_id}), body,
                          "application/json", "utf-8", '{"queue": "q"}', 60_000)  # fmt: skip


def _holder(client: redis.Redis, key: str, task_id: str, *, queued: bool) -> RedisLock:
    lock = RedisLock(client, key, timeout=30, holder_info={"task_id": task_id, "queued": queued})
    assert lock.acquire(blocking=False)
    return lock


def test_throttle_admits_up_to_the_limit_then_says_when(client: redis.Redis, key: str) -> None:
    """Two starts per 10 s are admitted and recorded; the third is refused with the time
    until the oldest leaves the window, and is not recorded."""
    assert atomic.throttle(client, key, limit=2, window_ms=10_000, member="a") is None
    assert atomic.throttle(client, key, limit=2, window_ms=10_000, member="b") is None
    wait = atomic.throttle(client, key, limit=2, window_ms=10_000, member="c")
    assert wait is not None
    assert 9.0 < wait <= 10.0
    starts = client.zrange(companion_key(key, STARTS), 0, -1)
    assert [member.split(b":")[0] for member in starts] == [b"a", b"b"]


def test_hold_keeps_owner_and_fence_and_refuses_a_non_owner(client: redis.Redis, key: str) -> None:
    """An owned hold becomes a hold of the given length (same owner and fencing token, new
    info, the record written); a lock without a hold, or whose key someone else holds, gets
    0 and changes nothing. The lock is not detached."""
    lock = RedisLock(client, key, timeout=5)
    assert atomic.hold(lock, 60_000, "held") == 0  # no hold: no token
    assert lock.acquire(blocking=False)
    fence = lock.fencing_token
    record = companion_key(key, "done")
    expiry = atomic.hold(lock, 60_000, "held", (record, "t-1", 10_000))
    assert expiry > 0
    value = parse_value(client.get(key) or b"")
    assert (value.token, value.fence, value.info, value.expiry_ms) == (
        lock.token, fence, "held", expiry,
    )  # fmt: skip
    assert client.pttl(key) > 60_000
    assert client.zscore(record, "t-1") is not None  # recorded as finished
    assert lock.token is not None  # not detached

    client.set(key, "1:0:someone-else:7:x", px=60_000)
    assert atomic.hold(lock, 60_000, "held") == 0
    assert client.get(key) == b"1:0:someone-else:7:x"
    lock.detach()


def test_follow_takes_follows_then_adopts(client: redis.Redis, key: str) -> None:
    """Free key: take. Held: the first call becomes the follow-up and later calls update it
    under the same task id. Freed with a follow-up left behind: the next call adopts it."""
    assert atomic.follow(client, key, _pending("t1")) == atomic.Followed("take", None)
    holder = _holder(client, key, "h", queued=False)
    assert atomic.follow(client, key, _pending("t1")) == atomic.Followed("follow", "t1")
    assert atomic.follow(client, key, _pending("t2", b"[[2], {}]")) == atomic.Followed(
        "follow", "t1"
    )
    pending = client.hgetall(companion_key(key, PENDING))
    assert (pending[b"id"], pending[b"token"], pending[b"body"]) == (b"t1", b"q-t1", b"[[2], {}]")
    holder.release()
    assert atomic.follow(client, key, _pending("t3")) == atomic.Followed("adopt", "t1")
    assert not client.exists(companion_key(key, PENDING))


def test_replace_supersedes_a_queued_holder_and_follows_a_running_one(
    client: redis.Redis, key: str
) -> None:
    """A queued holder is superseded: the key is the new call's (a larger fencing token) and
    the old task id is marked. A running holder gets the call as its follow-up, or, with
    ``running``, is named to be revoked while the call becomes its follow-up (the key is
    not taken from a running holder). A free key: take."""
    assert atomic.replace(
        client, key, _pending("n0"), running=False, lease_ms=30_000
    ) == atomic.Followed("take", None)
    queued = _holder(client, key, "old", queued=True)
    old_fence = queued.fencing_token or 0
    found = atomic.replace(client, key, _pending("n1"), running=False, lease_ms=30_000)
    assert found == atomic.Followed("superseded", "old")
    value = parse_value(client.get(key) or b"")
    assert value.token == "q-n1"
    assert (value.fence or 0) > old_fence
    assert atomic.superseded_by(client, key, "old") == "n1"
    assert atomic.superseded_by(client, key, "other") is None
    queued.detach()
    client.delete(key)

    running = _holder(client, key, "run", queued=False)
    assert atomic.replace(
        client, key, _pending("n2"), running=False, lease_ms=30_000
    ) == atomic.Followed("follow", "n2", "run")
    client.delete(companion_key(key, PENDING))
    assert atomic.replace(
        client, key, _pending("n3"), running=True, lease_ms=30_000
    ) == atomic.Followed("revoke", "n3", "run")
    assert parse_value(client.get(key) or b"").token == running.token  # still the holder's
    assert client.hget(companion_key(key, PENDING), "id") == b"n3"
    running.detach()


def test_hand_over_gives_the_lock_to_the_follow_up_or_releases_it(
    client: redis.Redis, key: str
) -> None:
    """The owner's run ends with a follow-up pending: the key goes to the follow-up's queue
    token (a new fencing token) and the call comes back, record written. Without a hold or
    not owned: nothing changed (-1: a follow-up still waits for the holder). Not detached."""
    holder = _holder(client, key, "h", queued=False)
    assert atomic.follow(client, key, _pending("f", b"\x00binary")) == atomic.Followed(
        "follow", "f"
    )
    assert atomic.hand_over(RedisLock(client, key, timeout=5), 30_000) == 0  # no hold
    stranger = RedisLock(client, key, timeout=5, token="stranger")
    assert atomic.hand_over(stranger, 30_000) == -1  # not the owner; a follow-up waits
    assert client.exists(companion_key(key, PENDING))

    fence = holder.fencing_token or 0
    record = companion_key(key, "done")
    handed = atomic.hand_over(holder, 30_000, (record, "h", 10_000))
    assert handed == atomic.Handed(
        "f", b"\x00binary", "application/json", "utf-8", '{"queue": "q"}'
    )
    value = parse_value(client.get(key) or b"")
    assert (value.token, value.waiters) == ("q-f", False)
    assert (value.fence or 0) > fence
    assert client.zscore(record, "h") is not None
    assert not client.exists(companion_key(key, PENDING))
    assert holder.token is not None  # not detached
    holder.detach()


def test_a_hand_over_asked_again_returns_the_call_it_handed(client: redis.Redis, key: str) -> None:
    """A hand-over whose reply was lost (a timeout while the server was stalled: the script
    ran, the client never heard) is asked again by the ending run: it gets the same call
    back, to publish, instead of "not owned" with the call gone. Someone else asking gets
    nothing; the handed call expires after ``HANDED_KEEP_MS``."""
    holder = _holder(client, key, "h", queued=False)
    atomic.follow(client, key, _pending("f"))
    first = atomic.hand_over(holder, 30_000)
    assert isinstance(first, atomic.Handed)
    assert not first.adopted
    again = atomic.hand_over(holder, 30_000)
    assert again == first
    assert parse_value(client.get(key) or b"").token == "q-f"  # still the follow-up's
    assert atomic.hand_over(RedisLock(client, key, timeout=5, token="other"), 30_000) == 0
    ttl = client.pttl(companion_key(key, HANDED))
    assert 0 < ttl <= atomic.HANDED_KEEP_MS
    holder.detach()


def test_a_follow_up_left_beside_a_free_lock_is_adopted(client: redis.Redis, key: str) -> None:
    """The holder died (or could not hand over while Redis erred) and its lease ran out:
    the sweep (or the late end of that run) hands the free key to the follow-up, with a
    fencing token above the old one. While the key is held, or with nothing pending, or
    beside a value that is not ours, nothing is done."""
    assert atomic.adopt(client, key, 30_000) == (False, None)  # nothing pending
    holder = _holder(client, key, "h", queued=False)
    old_fence = holder.fencing_token or 0
    atomic.follow(client, key, _pending("f"))
    assert atomic.adopt(client, key, 30_000) == (True, None)  # the holder holds it
    raw = client.get(key) or b""
    client.set(key, b"1000:" + raw.split(b":", 1)[1], px=60_000)  # its lease ran out
    waiting, handed = atomic.adopt(client, key, 30_000)
    assert waiting is False
    assert handed is not None
    assert (handed.task_id, handed.adopted) == ("f", True)
    adopted = parse_value(client.get(key) or b"")
    assert adopted.token == "q-f"
    assert (adopted.fence or 0) > old_fence
    assert not client.exists(companion_key(key, PENDING))
    holder.detach()

    client.delete(key)
    atomic.follow(client, key, _pending("g"))  # the lock is free: "take"; plant one instead
    client.hset(companion_key(key, PENDING), mapping={"id": "g", "token": "q-g", "info": "{}",
                "body": b"[[], {}]", "ctype": "application/json", "encoding": "utf-8",
                "options": "{}"})  # fmt: skip
    late = RedisLock(client, key, timeout=5, token="h-gone")  # its lease ran out, key gone
    found = atomic.hand_over(late, 30_000)
    assert isinstance(found, atomic.Handed)
    assert (found.task_id, found.adopted) == ("g", True)

    client.delete(key, companion_key(key, PENDING))
    client.hset(companion_key(key, PENDING), mapping={"id": "x", "token": "q-x", "info": "{}"})
    client.set(key, "garbage")  # not a value of ours, no TTL: the next call decides
    assert atomic.adopt(client, key, 30_000) == (True, None)
    assert client.get(key) == b"garbage"


def test_hand_over_without_a_follow_up_releases_in_the_same_step(
    client: redis.Redis, key: str
) -> None:
    """No follow-up pending: the end of the run releases the key in the same step, so a call
    made right after finds it free and is published ("take"), instead of becoming a
    follow-up of a hold that is about to go (which nobody would publish)."""
    holder = _holder(client, key, "h", queued=False)
    record = companion_key(key, "done")
    assert atomic.hand_over(holder, 30_000, (record, "h", 10_000)) == 1
    assert not client.exists(key)
    assert client.zscore(record, "h") is not None
    assert atomic.follow(client, key, _pending("late")) == atomic.Followed("take", None)
    assert not client.exists(companion_key(key, PENDING))
    holder.detach()


def test_hand_over_without_a_follow_up_serves_the_waiters(client: redis.Redis, key: str) -> None:
    """With a waiter queued, the release half hands the lock to it, as RELEASE does."""
    holder = _holder(client, key, "h", queued=False)
    waiter = RedisLock(client, key, timeout=5)
    assert not waiter.acquire(timeout=0.2)  # queued (and left the queue when it timed out)
    waiting = RedisLock(client, key, timeout=5)
    assert waiting.protocol.acquire("w1", 5000, b"0", "", 5000).acquired is False  # queues w1
    assert atomic.hand_over(holder, 30_000) == 3
    assert parse_value(client.get(key) or b"").token == "w1"
    holder.detach()


def test_debounce_join_and_run(client: redis.Redis, key: str) -> None:
    """Calls join one burst (same task id, generations 1, 2) due a quiet time after the
    last; only the latest generation runs, and again when redelivered or retried, until
    the burst is recorded as finished; a call after that opens a new burst."""
    first = atomic.debounce_join(client, key, "a", quiet_ms=5_000, max_wait_ms=0, keep_ms=60_000)
    assert (first.task_id, first.generation) == ("a", 1)
    assert 4.5 < first.countdown <= 5.0
    second = atomic.debounce_join(
        client, key, "b", quiet_ms=5_000, max_wait_ms=2_000, keep_ms=60_000
    )
    assert (second.task_id, second.generation) == ("a", 2)
    assert second.countdown <= 2.0  # capped by the max wait after the first call
    assert client.exists(companion_key(key, DEBOUNCE))

    assert not atomic.debounce_run(client, key, "a", "1", keep_ms=60_000)  # stale generation
    assert atomic.debounce_run(client, key, "a", "2", keep_ms=60_000)
    assert atomic.debounce_run(client, key, "a", "2", keep_ms=60_000)  # a retry: still runs
    client.zadd(companion_key(key, "done"), {"a": 1})  # the burst's run finished
    assert not atomic.debounce_run(client, key, "a", "2", keep_ms=60_000)  # not again
    third = atomic.debounce_join(client, key, "c", quiet_ms=5_000, max_wait_ms=0, keep_ms=60_000)
    assert (third.task_id, third.generation) == ("c", 1)


def test_a_burst_delayed_past_the_next_one_still_runs(client: redis.Redis, key: str) -> None:
    """A busy worker delivers burst "a" after its due time, when a later call opened burst
    "n": "a"'s latest message still runs (its own record), and so does "n"'s."""
    atomic.debounce_join(client, key, "a", quiet_ms=50, max_wait_ms=0, keep_ms=60_000)
    atomic.debounce_join(client, key, "a2", quiet_ms=50, max_wait_ms=0, keep_ms=60_000)
    time.sleep(0.1)  # "a" is due and not delivered yet
    later = atomic.debounce_join(client, key, "n", quiet_ms=50, max_wait_ms=0, keep_ms=60_000)
    assert (later.task_id, later.generation) == ("n", 1)
    assert not atomic.debounce_run(client, key, "a", "1", keep_ms=60_000)
    assert atomic.debounce_run(client, key, "a", "2", keep_ms=60_000)
    assert atomic.debounce_run(client, key, "n", "1", keep_ms=60_000)


def test_a_lost_burst_record_lets_the_first_message_win(client: redis.Redis, key: str) -> None:
    """After a restart lost the records, the first message of a burst delivered runs and
    the burst's other messages do not (one run, not one per message)."""
    atomic.debounce_join(client, key, "a", quiet_ms=5_000, max_wait_ms=0, keep_ms=60_000)
    atomic.debounce_join(client, key, "b", quiet_ms=5_000, max_wait_ms=0, keep_ms=60_000)
    client.flushall()
    assert atomic.debounce_run(client, key, "a", "1", keep_ms=60_000)
    assert not atomic.debounce_run(client, key, "a", "2", keep_ms=60_000)
    assert atomic.debounce_run(client, key, "a", "1", keep_ms=60_000)  # its retry

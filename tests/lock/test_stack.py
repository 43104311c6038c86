"""Stacked limits in the engine (``RedisLock(stack=...)``), on a real redis-server: a hold
takes its key and a share of every limit in one step or nothing; weights count; a number set
in Redis wins over the code's and a lowered one takes nothing away; a crashed holder's
shares end with its lease; release gives them back and wakes a waiter held back by them;
renewal keeps them; planted garbage never reads as room; one round trip per acquire."""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockError, LockNotOwned, RedisLock, WeightAboveLimit
from celery_singleton_lock.engine import atomic
from celery_singleton_lock.engine.keyspace import QUEUE, companion_key
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.explain import explain_key
from celery_singleton_lock.testing import RedisServer

#: What a new connection of the pool sends before its first command (not a lock's).
HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT"})


@pytest.fixture
def prefix() -> str:
    """An application prefix no other test uses (its stack keys are its own)."""
    return f"st{uuid.uuid4().hex[:8]}"


def make(client: redis.Redis, prefix: str) -> Callable[..., RedisLock]:
    """Locks of one application: ``lock(job, tenant=..., weight=..., number=...)`` holds job
    ``job`` with a share of ``tenant:<tenant>`` (``per_tenant``) and ``global`` (``in_all``)."""

    def lock(
        job: str,
        tenant: str = "a",
        weight: int = 1,
        per_tenant: int = 3,
        in_all: int = 4,
        **kwargs: object,
    ) -> RedisLock:
        stack = Stack(
            stack_base(prefix),
            (
                Limit(f"tenant:{tenant}", "tenant:{tenant}", per_tenant),
                Limit("global", "global", in_all),
            ),
            weight,
        )
        kwargs.setdefault("timeout", 10)
        return RedisLock(client, f"{prefix}:job:{job}:{{{prefix}:stack}}", stack=stack, **kwargs)  # type: ignore[arg-type]

    return lock


def shares(client: redis.Redis, prefix: str, name: str) -> list[bytes]:
    return client.zrange(stack_base(prefix) + "limit:" + name, 0, -1)  # type: ignore[return-value]


def test_all_or_nothing(client: redis.Redis, prefix: str) -> None:
    """A tenant that is full holds a run back: its key stays free and the global limit
    gets no share; the limit that held it back is named."""
    lock = make(client, prefix)
    held = [lock(f"j{i}") for i in range(3)]
    assert all(h.acquire(blocking=False) for h in held)
    fourth = lock("j3")
    assert not fourth.acquire(blocking=False)
    assert fourth.held_back_by == "tenant:a"
    assert client.get(fourth.name) is None
    assert len(shares(client, prefix, "global")) == 3
    other = lock("j4", tenant="b")
    assert other.acquire(blocking=False)  # another tenant: the global limit has room
    assert len(shares(client, prefix, "global")) == 4
    fifth = lock("j5", tenant="c")
    assert not fifth.acquire(blocking=False)
    assert fifth.held_back_by == "global"
    assert shares(client, prefix, "tenant:c") == []
    for h in (*held, other):
        h.release()
    assert shares(client, prefix, "global") == []


def test_weights_count_in_every_limit(client: redis.Redis, prefix: str) -> None:
    """A weight-2 hold takes two of each limit; a second one no longer fits in a tenant of
    three, a weight-1 one still does; a weight-5 one never would, and is refused."""
    lock = make(client, prefix)
    heavy = lock("h1", weight=2)
    assert heavy.acquire(blocking=False)
    assert shares(client, prefix, "tenant:a") == [f"2:{heavy.token}".encode()]
    second = lock("h2", weight=2)
    assert not second.acquire(blocking=False)
    assert second.held_back_by == "tenant:a"
    light = lock("l1")
    assert light.acquire(blocking=False)
    too_heavy = lock("h3", tenant="b", weight=5)
    with pytest.raises(WeightAboveLimit):  # 5 never fits in 3
        too_heavy.acquire(blocking=False)
    heavy.release()
    light.release()


def test_a_number_set_in_redis_wins_and_lowering_it_takes_nothing_away(
    client: redis.Redis, prefix: str
) -> None:
    """By name, then by template, then the code's number; lowered below what is held, the
    holds stay, and new ones wait until the use is under the new number."""
    lock = make(client, prefix)
    capacities = stack_base(prefix) + "limits"
    held = [lock(f"j{i}") for i in range(3)]
    assert all(h.acquire(blocking=False) for h in held)
    client.hset(capacities, "tenant:{tenant}", 1)  # every tenant: 1
    assert all(h.owned() for h in held)
    for h in held:
        h.extend()  # renewal keeps a share the lowered number no longer allows
    b1 = lock("b1", tenant="b")
    assert b1.acquire(blocking=False)
    b2 = lock("b2", tenant="b")
    assert not b2.acquire(blocking=False)  # b1 took tenant b's only place
    held[0].release()
    held[1].release()
    assert not lock("a9").acquire(blocking=False)  # tenant a still uses 1 of 1
    client.hset(capacities, "tenant:a", 5)  # by name: wins over the template's 1
    a10 = lock("a10")
    assert a10.acquire(blocking=False)
    client.hset(capacities, "tenant:a", "lots")  # garbage: ignored, the template's 1 counts
    assert not lock("a11").acquire(blocking=False)
    client.delete(capacities)
    for h in (held[2], a10, b1):
        h.release()


def server_ms(client: redis.Redis) -> int:
    """The server's clock in ms: the clock every lease and share end is on."""
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for_server_ms(client: redis.Redis, when: int, bound: float = 60.0) -> None:
    """Return once the server's clock has passed ``when`` (bounded: a generous 60 s)."""
    deadline = time.monotonic() + bound
    while server_ms(client) <= when:
        assert time.monotonic() < deadline, "the server's clock did not reach the lease end"
        time.sleep(0.05)


def test_a_crashed_holders_shares_end_with_its_lease(client: redis.Redis, prefix: str) -> None:
    """A holder that never releases (nor renews) leaves its shares until its lease ends;
    then a new hold takes them, and the dead share is gone from the limit.

    Every expectation is read off the server's clock, never the test's: the three dead
    shares are taken a few ms apart, so they end a few ms apart (each share's end is its
    score); a take happened at its own share's score minus its lease."""
    lock = make(client, prefix)
    limit = stack_base(prefix) + "limit:tenant:a"
    dead = [lock(f"d{i}", timeout=0.5) for i in range(3)]
    before = server_ms(client)
    assert all(d.acquire(blocking=False) for d in dead)
    after = server_ms(client)
    ends = {m: int(s) for m, s in client.zrange(limit, 0, -1, withscores=True)}
    assert set(ends) == {f"1:{d.token}".encode() for d in dead}
    # each share ends with its holder's lease: taken between before and after, 500 ms long
    assert all(before + 500 <= end <= after + 500 for end in ends.values())
    waiter = lock("w")
    asked = server_ms(client)
    if not waiter.acquire(blocking=False):
        assert asked < min(ends.values())  # refused only while every dead share was live
        wait_for_server_ms(client, min(ends.values()))
        # the first lease has ended by the server's clock: its share counts no more
        assert waiter.acquire(blocking=False)
    mine = f"1:{waiter.token}".encode()
    took_at = int(client.zscore(limit, mine)) - 10_000  # type: ignore[arg-type]
    assert took_at >= min(ends.values())  # never while all three were live
    # the shares that had ended by then are gone; those still live stay (they end later)
    assert set(shares(client, prefix, "tenant:a")) == {mine} | {
        m for m, end in ends.items() if end > took_at
    }
    # once every dead lease has ended (by the server's clock), all three places are free
    wait_for_server_ms(client, max(ends.values()))
    more = [lock(f"n{i}") for i in range(2)]
    assert all(m.acquire(blocking=False) for m in more)
    assert set(shares(client, prefix, "tenant:a")) == {mine} | {
        f"1:{m.token}".encode() for m in more
    }
    for held in (waiter, *more):
        held.release()


def test_release_wakes_a_waiter_held_back_by_a_limit(client: redis.Redis, prefix: str) -> None:
    """A waiter held back by the global limit (its own key free) is woken by a release of
    another key's share, long before its fallback poll.

    Judged on the server's clock, not on how long the wait took: the waiter's take (its
    share's score minus its lease) comes after the release and before any held share's
    lease ends (60 s on); its fallback poll is 60 s too, so only the release's wake-up can
    let it in before then."""
    lock = make(client, prefix)
    held = [lock(f"g{i}", tenant=f"t{i}", timeout=60) for i in range(4)]
    assert all(h.acquire(blocking=False) for h in held)
    limit = stack_base(prefix) + "limit:global"
    ends = [int(s) for _, s in client.zrange(limit, 0, -1, withscores=True)]
    waiter = lock("wx", tenant="x", fallback_poll=60)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=45)))
    thread.start()
    time.sleep(0.5)
    assert not got  # the limit is full for a minute: nothing lets it in meanwhile
    released_at = server_ms(client)
    held[0].release()
    thread.join(timeout=60)
    assert got == [True]
    took_at = int(client.zscore(limit, f"1:{waiter.token}")) - 10_000  # type: ignore[arg-type]
    assert released_at <= took_at < min(ends)  # woken by the release, not a lease or a poll
    waiter.release()
    for h in held[1:]:
        h.release()


def test_renewal_keeps_the_shares_and_a_lapsed_one_that_no_longer_fits_is_lost(
    client: redis.Redis, prefix: str
) -> None:
    """extend() moves every share's end with the lease. A holder whose lease ran out and
    whose place was taken meanwhile cannot extend (LockNotOwned), as for a lost key; one
    whose place is still free gets it back."""
    lock = make(client, prefix)
    slow = lock("s", per_tenant=1, timeout=0.5)
    assert slow.acquire(blocking=False)
    slow.extend(10)
    score = client.zscore(stack_base(prefix) + "limit:tenant:a", f"1:{slow.token}")
    assert score is not None
    time.sleep(0.6)
    assert slow.owned()  # renewed: nobody could take the place
    slow.extend(0.5)
    time.sleep(0.7)  # its lease ends; its key lingers for its grace, its share is pruned
    rival = lock("r", per_tenant=1)
    assert rival.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        slow.extend(10)
    rival.release()
    again = lock("s2", per_tenant=1, timeout=0.5)
    assert again.acquire(blocking=False)
    time.sleep(0.7)
    again.extend(10)  # lapsed, but its place is still free: back
    assert shares(client, prefix, "tenant:a") == [f"1:{again.token}".encode()]
    again.release()


def test_planted_garbage_never_reads_as_room(client: redis.Redis, prefix: str) -> None:
    """Members of another layout count as weight 1 until their score passes; a record of
    a hold that is garbage does not stop its release."""
    lock = make(client, prefix)
    limit = stack_base(prefix) + "limit:tenant:a"
    far = int(time.time() * 1000) + 60_000
    client.zadd(limit, {"garbage": far, "0:zero": far})  # weight 0 is no weight: 1
    one = lock("one")
    assert one.acquire(blocking=False)  # 1 + 1 planted: room for 1 of 3
    assert not lock("two").acquire(blocking=False)
    one.release()
    client.zadd(limit, {"garbage": 1})  # its end passed: pruned, room again
    two = lock("two")
    assert two.acquire(blocking=False)
    two.release()
    client.delete(limit)
    three = lock("three")
    assert three.acquire(blocking=False)
    client.set(f"{three.name}:stack:{three.token}", "{not json")
    three.release()
    assert not client.exists(three.name)


def test_slots_and_a_stack_together(client: redis.Redis, prefix: str) -> None:
    """lock_limit=2 per key inside a tenant of 3: the key's two slots fill, the third run
    of the key waits for a slot, a run of another key takes the tenant's last place."""
    lock = make(client, prefix)
    a, b, c = (lock("k", limit=2) for _ in range(3))
    assert a.acquire(blocking=False)
    assert b.acquire(blocking=False)
    assert not c.acquire(blocking=False)
    assert c.held_back_by is None  # the key's slots, not a limit
    other = lock("other")
    assert other.acquire(blocking=False)
    assert not lock("another").acquire(blocking=False)
    a.release()
    assert c.acquire(blocking=False)
    for h in (b, c, other):
        h.release()
    assert shares(client, prefix, "tenant:a") == []


def test_exclusion_under_threads(client: redis.Redis, prefix: str) -> None:
    """Eight threads, 200 holds of random keys, tenants and weights: the weight inside a
    tenant (limit 3) and in all (limit 4), counted by the holders themselves, never goes over."""
    lock = make(client, prefix)
    inside: dict[str, int] = {}
    peaks: dict[str, int] = {}
    guard = threading.Lock()
    over: list[str] = []
    rounds = iter(range(200))

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in rounds:
            tenant, weight = rng.choice("ab"), rng.choice((1, 1, 2))
            held = lock(f"k{rng.randrange(20)}", tenant=tenant, weight=weight)
            if not held.acquire(timeout=20):
                over.append("timeout")
                continue
            with guard:
                for name, most in ((tenant, 3), ("all", 4)):
                    inside[name] = inside.get(name, 0) + weight
                    peaks[name] = max(peaks.get(name, 0), inside[name])
                    if inside[name] > most:
                        over.append(name)
            time.sleep(rng.uniform(0, 0.004))
            with guard:
                for name in (tenant, "all"):
                    inside[name] -= weight
            held.release()

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not over
    assert peaks["all"] == 4  # it was full at some moment: the test could have seen more


def test_an_acquire_is_one_round_trip(fresh_server: RedisServer) -> None:
    """Taking the key and a share of three limits is one command from the client (one
    EVALSHA; MONITOR lists what clients send, and what scripts run marked as theirs)."""
    with redis.Redis.from_url(fresh_server.url) as client:
        base = stack_base("rt")
        stack = Stack(base, tuple(Limit(f"l{i}", f"l{i}", 5) for i in range(3)), 2)
        lock = RedisLock(client, "rt:job:{rt:stack}", stack=stack)
        assert lock.acquire(blocking=False)  # loads the script
        lock.release()
        seen: list[str] = []
        with client.monitor() as monitor:
            listening = threading.Event()

            def watch() -> None:
                listening.set()
                for event in monitor.listen():
                    command = str(event["command"])
                    if command.startswith("SET rt:done"):
                        return
                    name = command.split(" ", 1)[0]
                    if event.get("client_type") != "lua" and name not in HANDSHAKE:
                        seen.append(name)

            thread = threading.Thread(target=watch)
            thread.start()
            listening.wait(5)
            time.sleep(0.2)
            assert lock.acquire(blocking=False)  # on the client's connection, already open
            client.set("rt:done", 1)
            thread.join(timeout=10)
        assert seen == ["EVALSHA"], seen
        lock.release()


def test_a_stack_needs_its_tag_and_scripts(client: redis.Redis, prefix: str) -> None:
    """A lock name without the stack's hash tag, or the plain protocol, is refused."""
    stack = Stack(stack_base(prefix), (Limit("g", "g", 1),))
    with pytest.raises(ValueError, match="hash tag"):
        RedisLock(client, f"{prefix}:job:{{other}}", stack=stack)
    with pytest.raises(ValueError, match="scripting"):
        RedisLock(client, f"{prefix}:job:{{{prefix}:stack}}", stack=stack, scripting=False)
    with pytest.raises(ValueError, match="weight"):
        Stack(stack_base(prefix), (Limit("g", "g", 1),), 0)


def test_a_lost_runs_cleanup_gives_the_shares_back(client: redis.Redis, prefix: str) -> None:
    """An owner-checked release by another instance that only knows the key and the owner
    token (how a lost run's lock is freed, and `locks reap`) gives back every share: the
    key's name says it is stacked."""
    lock = make(client, prefix)
    held = lock("lost", weight=2)
    assert held.acquire(blocking=False)
    assert held.token is not None
    cleanup = RedisLock(client, held.name, token=held.token)
    cleanup.extend(20)  # renews the shares too
    assert client.zscore(stack_base(prefix) + "limit:global", f"2:{held.token}") is not None
    cleanup.release()
    assert shares(client, prefix, "tenant:a") == []
    assert shares(client, prefix, "global") == []


def test_locks_without_a_stack_never_touch_stack_keys(fresh_server: RedisServer) -> None:
    """A user allowed only the keys of locks as they were before stacks (no ``stack:``
    record, no stack tag) still acquires, extends and releases plain and slotted locks:
    no script of theirs reads a stack's keys."""
    with redis.Redis.from_url(fresh_server.url) as admin:
        admin.execute_command(
            "ACL", "SETUSER", "old", "on", ">pw", "resetkeys", "~app:*}", "~app:*}:signal",
            "~app:*}:queue", "~app:*}:waiter:*", "~app:*}:grant:*", "~app:*}:slot:*",
            "~app:*}:slots", "~app:*}:owners", "~app:*}:fence", "+@all",
        )  # fmt: skip
        url = fresh_server.url.replace("redis://", "redis://old:pw@")
        with redis.Redis.from_url(url) as user:
            for limit in (1, 3):
                lock = RedisLock(user, f"app:job:{{{limit}}}", limit=limit)
                assert lock.acquire(blocking=False)
                lock.extend(5)
                lock.release()


def test_a_heavy_waiter_is_not_passed_for_ever(client: redis.Redis, prefix: str) -> None:
    """Six threads keep taking weight-1 shares of a limit of 3 (more of them than places, so
    a freed place is always wanted at once); a weight-3 waiter still gets in, because every
    take leaves room for the waiters ahead of it; the light ones wait behind it meanwhile.

    Judged on the server's clock, not on how long the heavy one waited: once the heavy
    one's place is seen in the limit's line, each light thread may take at most once more
    before the heavy one does (a try that was already waiting ahead of it); every later try
    comes after it (each take's time is its share's score minus its lease). Without that
    room the light ones keep taking, and the heavy one gets in only by luck (30 s)."""
    lock = make(client, prefix)
    line = stack_base(prefix) + "line:tenant:a"
    limit = stack_base(prefix) + "limit:tenant:a"
    stop = threading.Event()
    holds = [0] * 6
    light_takes: list[tuple[int, int]] = []

    def light(index: int) -> None:
        while not stop.is_set():
            held = lock(f"light{index}-{holds[index]}", per_tenant=3, fallback_poll=0.2)
            if held.acquire(timeout=10):
                score = client.zscore(limit, f"1:{held.token}")
                assert score is not None
                light_takes.append((index, int(score) - 10_000))
                time.sleep(0.03)
                held.release()
                holds[index] += 1

    queued_at: list[int] = []

    def watch_the_line() -> None:  # when the heavy one is surely ahead of every light one
        while not stop.is_set() and not queued_at:
            if client.zscore(line, "3:heavy-owner") is not None:
                queued_at.append(server_ms(client))
            time.sleep(0.002)

    threads = [threading.Thread(target=light, args=(index,)) for index in range(6)]
    watcher = threading.Thread(target=watch_the_line)
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while sum(holds) <= 10:  # the light ones really keep the limit busy
            assert time.monotonic() < deadline, holds
            time.sleep(0.02)
        heavy = lock("heavy", weight=3, per_tenant=3, fallback_poll=0.2, token="heavy-owner")
        watcher.start()
        assert heavy.acquire(timeout=30)
        took_at = int(client.zscore(limit, "3:heavy-owner")) - 10_000  # type: ignore[arg-type]
        assert shares(client, prefix, "tenant:a") == [b"3:heavy-owner"]
        heavy.release()
    finally:
        stop.set()
        for thread in (*threads, watcher):
            if thread.is_alive() or thread is not watcher:
                thread.join(timeout=20)
    if queued_at:  # (it may have found the limit free at its first try: nothing to judge)
        passed = [index for index, t in light_takes if queued_at[0] < t < took_at]
        assert all(passed.count(index) <= 1 for index in range(6)), passed


def test_a_take_leaves_room_for_the_waiters_ahead(client: redis.Redis, prefix: str) -> None:
    """Step by step: with 2 of 3 used, a weight-3 run waits (in a thread); one share is
    freed, and a weight-1 newcomer that would fit is held back all the same (it would pass
    the heavy one); once the other share is freed the heavy run gets in, and the newcomer
    after it. A waiter that stopped waiting (its timeout) holds nobody up."""
    lock = make(client, prefix)
    one, two = lock("one"), lock("two")
    assert one.acquire(blocking=False)
    assert two.acquire(blocking=False)
    heavy = lock("heavy", weight=3, fallback_poll=5)
    got = threading.Event()

    def wait() -> None:
        if heavy.acquire(timeout=20):
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    line = stack_base(prefix) + "line:tenant:a"
    deadline = time.monotonic() + 5
    while client.zcard(line) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    one.release()
    newcomer = lock("new")
    assert not newcomer.acquire(blocking=False)
    assert newcomer.held_back_by == "tenant:a"
    assert not got.is_set()
    two.release()
    assert got.wait(10)
    thread.join(timeout=10)
    assert not newcomer.acquire(blocking=False)  # 3 of 3 used now
    heavy.release()
    assert newcomer.acquire(blocking=False)
    newcomer.release()
    three, gone = lock("three"), lock("gone", weight=3, fallback_poll=5)
    assert three.acquire(blocking=False)
    assert not gone.acquire(timeout=0.05)  # waited, then stopped: its place goes with it
    assert client.zcard(line) == 0
    late = lock("late")
    assert late.acquire(blocking=False)
    for held in (three, late):
        held.release()


def test_explain_counts_the_waiters_ahead(client: redis.Redis, prefix: str) -> None:
    """With 2 of 4 used in all and a weight-3 run waiting for room there, a new weight-1 run
    does not fit (2 + 3 waiting + 1 > 4): the explanation says so, as the acquire does."""
    lock = make(client, prefix)
    one, blocker = lock("one"), lock("blocker", tenant="z")
    assert one.acquire(blocking=False)
    assert blocker.acquire(blocking=False)  # global: 2 of 4
    heavy = lock("heavy", weight=3, tenant="b", fallback_poll=5)  # 2 + 3 > 4: waits
    got = threading.Event()

    def wait() -> None:
        if heavy.acquire(timeout=20):
            got.set()

    waiting = threading.Thread(target=wait)
    waiting.start()
    line = stack_base(prefix) + "line:global"
    deadline = time.monotonic() + 5
    while client.zcard(line) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    newcomer = lock("new")
    assert newcomer.stack is not None
    explained = explain_key(client, newcomer.name, stack=newcomer.stack)
    found = {use.name: use for use in explained.limits}
    assert found["global"].used == 2
    assert found["global"].waiting == 3
    assert not found["global"].fits
    assert found["tenant:a"].fits
    assert explained.state == "limited"
    assert not newcomer.acquire(blocking=False)
    assert newcomer.held_back_by == "global"
    one.release()
    blocker.release()
    waiting.join(timeout=20)
    assert got.is_set()
    heavy.release()


@pytest.mark.parametrize("planted", ["limit:global", "limits", "line:global"])
def test_a_planted_key_of_another_type_is_a_clear_error(
    client: redis.Redis, prefix: str, planted: str
) -> None:
    """A string planted where a limit, the numbers or a line live: the acquire fails with
    an error naming that key (never read as room), and nothing is taken."""
    lock = make(client, prefix)
    key = stack_base(prefix) + planted
    client.set(key, "garbage")
    held = lock("victim")
    with pytest.raises(LockError, match=re.escape(key)):
        held.acquire(blocking=False)
    assert client.get(held.name) is None
    client.delete(key)
    assert held.acquire(blocking=False)
    held.release()


def test_two_waiters_never_leave_room_for_each_other(client: redis.Redis, prefix: str) -> None:
    """Every line is ordered by one arrival per call. X waits for room in all (it fit its
    tenant then); a younger Y waits for both its tenant and all. Once both limits are free,
    X gets in: Y, younger, is not ahead of X in the tenant's line even though X never stood
    in it. (Ordering each line by its own first entry let X leave room for Y in the tenant
    and Y for X in all: neither ever got in.)"""
    lock = make(client, prefix)
    others = [lock(f"g{i}", tenant=f"t{i}") for i in range(3)]
    assert all(held.acquire(blocking=False) for held in others)  # all: 3 of 4
    x_stack, y_stack = lock("x", weight=2).stack, lock("y", weight=2).stack
    assert x_stack is not None
    assert y_stack is not None
    assert atomic.stack_line(client, lock("x").name, x_stack, "X", 30_000) == "global"
    for held in others:
        held.release()
    w = lock("w", weight=2)
    assert w.acquire(blocking=False)  # tenant a 2 of 3, all 2 of 4 (2 left for X)
    assert atomic.stack_line(client, lock("y").name, y_stack, "Y", 30_000) == "tenant:a"
    w.release()
    x = lock("x", weight=2, claim="X")
    assert x.acquire(blocking=False)
    y = lock("y", weight=2, claim="Y")
    assert not y.acquire(blocking=False)
    assert y.held_back_by == "tenant:a"
    x.release()
    assert y.acquire(blocking=False)
    y.release()


def test_a_take_answered_after_its_lease_keeps_its_shares_until_released(
    fresh_server: RedisServer, prefix: str
) -> None:
    """A take sent while the server is stopped, and run only once it continues after the
    client's lease ran out (a chaos soak's redis_stop longer than the lease): the client
    reports its lease lost at once, but the server runs the take with a fresh lease, and
    its shares keep the limit full until the run releases them. So a run that began with
    its lease lost was never beyond a limit; the invariant checker judges it as it enters
    and counts it for nothing after."""
    sent = threading.Event()

    class Sent(redis.Connection):
        """Records that a command left the client (when the take was sent)."""

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            super().send_packed_command(command, check_health)
            sent.set()

    def live(client: redis.Redis, token: str | None) -> bool:
        """Whether the server holds that share and its lease has not ended (read at once)."""
        pipe = client.pipeline(transaction=True)
        pipe.time().zscore(stack_base(prefix) + "limit:global", f"1:{token}")
        (seconds, micros), score = pipe.execute()
        return score is not None and score > seconds * 1000 + micros // 1000

    pool = redis.ConnectionPool(connection_class=Sent, port=fresh_server.port, socket_timeout=60)
    with redis.Redis(connection_pool=pool) as client, contextlib.closing(pool):
        lock = make(client, prefix)
        warm = lock("warm", per_tenant=1, in_all=1)  # loads the scripts: one send per take
        assert warm.acquire(blocking=False)
        warm.release()
        late = lock("late", per_tenant=1, in_all=1, timeout=2, auto_renew=False)
        got: list[bool] = []
        fresh_server.pause()
        try:
            sent.clear()
            thread = threading.Thread(target=lambda: got.append(late.acquire(blocking=False)))
            thread.start()
            assert sent.wait(30)
            waited_from = time.monotonic()
            while time.monotonic() < waited_from + 2.2:  # the client's lease (2 s) runs out
                time.sleep(0.1)
        finally:
            fresh_server.resume()
        thread.join(30)
        assert got == [True]
        assert late.lease_lost  # dated from before the send: gone before the answer came
        rival = lock("rival", per_tenant=1, in_all=1)
        took = rival.acquire(blocking=False)
        if live(client, late.token):  # then it was live at the rival's take too
            assert not took
            assert rival.held_back_by is not None
        with contextlib.suppress(LockNotOwned):  # raised only once the server let it go
            late.release()
        assert not live(client, late.token)
        if not took:
            assert rival.acquire(blocking=False)
        assert live(client, rival.token)
        rival.release()


def test_a_weight_above_a_number_is_refused_for_good(client: redis.Redis, prefix: str) -> None:
    """A weight above a limit's number as it applies (the code's, or one set in Redis by
    name or template) raises WeightAboveLimit naming that limit, its number and the weight,
    at once (a blocking try too), taking nothing; with slots as well. A number of 0 pauses
    (holds back, no refusal); a number set above the code's lets the same weight in."""
    lock = make(client, prefix)
    capacities = stack_base(prefix) + "limits"
    with pytest.raises(WeightAboveLimit) as raised:
        lock("h1", weight=4).acquire(blocking=False)  # tenant a: 3 in the code
    assert (raised.value.limit, raised.value.number, raised.value.weight) == ("tenant:a", 3, 4)
    assert raised.value.name == lock("h1").name
    assert "'tenant:a'" in str(raised.value)
    client.hset(capacities, "global", 2)
    began = time.monotonic()
    with pytest.raises(WeightAboveLimit) as raised:
        lock("h2", tenant="b", weight=3).acquire(timeout=60)  # blocking: refused, not waiting
    assert time.monotonic() - began < 30  # well before its 60 s wait ran out
    assert (raised.value.limit, raised.value.number) == ("global", 2)
    with pytest.raises(WeightAboveLimit):
        lock("h3", tenant="c", weight=3, limit=2).acquire(blocking=False)  # slots
    client.hset(capacities, "tenant:e", 0)  # 0 is a pause: held back, not refused
    paused = lock("h5", tenant="e", weight=2)  # fits global (2)
    assert not paused.acquire(blocking=False)
    assert paused.held_back_by == "tenant:e"
    client.hset(capacities, mapping={"global": 9, "tenant:{tenant}": 5})
    fits = lock("h4", tenant="d", weight=4)
    assert fits.acquire(blocking=False)
    for name in ("tenant:a", "tenant:b", "tenant:c"):
        assert shares(client, prefix, name) == []
    assert shares(client, prefix, "global") == [f"4:{fits.token}".encode()]
    assert client.get(lock("h1").name) is None
    fits.release()


def test_a_waiter_refused_for_good_leaves_the_queue_and_the_lines(
    client: redis.Redis, prefix: str
) -> None:
    """A blocking try waits for its held key; the number of its tenant is lowered below
    its weight meanwhile, in Redis: when the key frees, its try is refused with
    WeightAboveLimit, and it keeps no place in the key's queue nor in any limit's line."""
    lock = make(client, prefix)
    capacities = stack_base(prefix) + "limits"
    holder = lock("k", weight=1)
    assert holder.acquire(blocking=False)
    crowd = lock("crowd", tenant="a", weight=2)
    assert crowd.acquire(blocking=False)  # tenant a: 3 of 3 used
    waiter = lock("k", weight=2)
    caught: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.acquire(timeout=60)
        except BaseException as exc:  # recorded for the test
            caught.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    queue = companion_key(waiter.name, QUEUE)
    deadline = time.monotonic() + 30
    while not client.zcard(queue) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.zcard(queue) == 1  # it waits for the key
    client.hset(capacities, "tenant:a", 1)
    holder.release()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(caught) == 1, caught
    assert isinstance(caught[0], WeightAboveLimit), caught
    assert caught[0].number == 1
    assert client.zcard(queue) == 0
    for name in ("tenant:a", "global"):
        assert client.zcard(stack_base(prefix) + f"line:{name}") == 0
    assert client.get(waiter.name) is None
    crowd.release()

"""Each Lua script's header says how many KEYS and ARGV it takes, and the code that calls it
passes that many: every wrapper of the engine (the lock's acquire, release and extend in
each shape, the batched renewal, every typed wrapper of ``engine.atomic``, the asyncio
lock) is called on a real redis-server under ``MONITOR``, and each ``EVALSHA`` the server
saw is checked against the contract of the script it ran (``engine.scripts.contract``,
which docs/design.md shows). Every registered script is seen at least once."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from celery_singleton_lock import RedisLock
from celery_singleton_lock.aio import AsyncRedisLock
from celery_singleton_lock.engine import atomic, beat
from celery_singleton_lock.engine.keyspace import DONE, companion_key
from celery_singleton_lock.engine.scripted import extend_all
from celery_singleton_lock.engine.scripts import SCRIPTS, Arity, arity, contract
from celery_singleton_lock.engine.stack import Limit, Stack, stack_base
from celery_singleton_lock.testing import RedisServer

#: How long the MONITOR reader waits for the server's echo of the end marker (only a
#: failing test waits this long).
MONITOR_BOUND = 60.0


def test_arity_reads_the_header_forms() -> None:
    """Required, optional, ranges and arguments that come with an optional key."""
    text = (
        "KEYS[1] lock key, KEYS[2] (optional) done set\n"
        "ARGV[1] token, ARGV[2] ms, ARGV[3], ARGV[4] (with KEYS[2]) record\n"
    )
    assert arity(text, "KEYS") == Arity(1, 2)
    assert arity(text, "ARGV") == Arity(2, 4)
    assert arity("ARGV[1..8] as FOLLOWUP_CALL, ARGV[9] x, ARGV[10] y", "ARGV") == Arity(10, 10)
    assert arity("ARGV[1] a, ARGV[2] (optional) b", "ARGV") == Arity(1, 2)


class Monitor:
    """The server's ``MONITOR`` feed, read raw on a socket of its own: every command with
    its exact arguments (redis-py's reader joins them with spaces)."""

    def __init__(self, server: RedisServer) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=MONITOR_BOUND)
        self.sock.sendall(b"MONITOR\r\n")
        self.buffer = b""
        assert self._line() == b"+OK"

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("MONITOR connection closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def until(self, marker: str) -> Iterator[list[str]]:
        """Each command seen, as its words, up to the ``ECHO marker`` that ends the run."""
        while True:
            words = [
                bytes(word, "latin-1").decode("unicode_escape")
                for word in re.findall(r'"((?:[^"\\]|\\.)*)"', self._line().decode("latin-1"))
            ]
            if words[:2] == ["ECHO", marker] or words[:2] == ["echo", marker]:
                return
            yield words

    def close(self) -> None:
        self.sock.close()


def drive_every_wrapper(client: redis.Redis, url: str) -> None:
    """Call every wrapper that runs a script, in each shape it sends (optional keys and
    arguments present and absent)."""
    tag = uuid.uuid4().hex[:8]
    name = f"sc:{{{tag}}}"
    done = companion_key(name, DONE)

    # The lock: a try, a contended blocking try, release with and without a record, extend.
    lock = RedisLock(client, name, timeout=5, holder_info={"host": "h", "pid": 1})
    assert lock.acquire(blocking=False)
    rival = RedisLock(client, name, timeout=5)
    assert not rival.acquire(timeout=0.05)
    lock.extend()
    lock.release(record=(done, "task-1", 60_000))
    assert lock.acquire(blocking=False)
    lock.release()
    fair = RedisLock(client, name, timeout=5, fair_after=0.5)
    assert fair.acquire(blocking=False)
    fair.release()
    fair.acquire(blocking=False)
    fair.release(record=(done, "task-2", 60_000))
    claimed = RedisLock(client, name, timeout=5, token="q-task-3")
    assert claimed.acquire(blocking=False)
    runner = RedisLock(client, name, timeout=5, claim="q-task-3")
    assert runner.acquire(blocking=False)
    runner.release()

    # Slots, and the batched renewal of a plain lock and of a slot.
    slots = RedisLock(client, f"sc:{{{tag}s}}", timeout=5, limit=2)
    assert slots.acquire(blocking=False)
    second = RedisLock(client, f"sc:{{{tag}s}}", timeout=5, limit=2)
    assert second.acquire(blocking=False)
    second.extend()
    held = RedisLock(client, name, timeout=5)
    assert held.acquire(blocking=False)
    assert held.token is not None
    assert second.token is not None
    replies = extend_all(
        client,
        [
            (held.name, held.name, held.token, 5000),
            (second.name, second.held_key, second.token, 5000),
        ],
    )
    assert all(isinstance(reply, int) and reply > 0 for reply in replies)
    second.release()
    slots.release()
    held.release()

    # Stacked limits: acquire (with and without a claim), extend, release with a record.
    prefix = f"st{tag}"
    stack = Stack(stack_base(prefix), (Limit("global", "global", 4),), 1)
    stacked_name = f"{prefix}:job:{{{prefix}:stack}}"
    stacked = RedisLock(client, stacked_name, timeout=5, stack=stack)
    assert stacked.acquire(blocking=False)
    stacked.extend()
    stacked.release(record=(companion_key(stacked_name, DONE), "task-4", 60_000))
    claimer = RedisLock(client, stacked_name, timeout=5, stack=stack, claim="q-task-5")
    assert claimer.acquire(blocking=False)
    claimer.release()
    assert atomic.stack_line(client, stacked_name, stack, "q-task-6", 5000) is None

    # The modes' wrappers.
    assert atomic.throttle(client, name, limit=2, window_ms=1000, member="t1") is None
    assert atomic.throttle_wait(client, name, limit=2, window_ms=1000) == 0.0
    for record in (None, (done, "task-7", 60_000)):
        holder = RedisLock(client, name, timeout=5)
        assert holder.acquire(blocking=False)
        assert atomic.hold(holder, 100, '{"held": "success"}', record) > 0
        client.delete(name)
    pending = atomic.Pending("task-8", "q-task-8", "{}", b"[]", "application/json", "utf-8",
                             "{}", 60_000)  # fmt: skip
    holder = RedisLock(client, name, timeout=5)
    assert holder.acquire(blocking=False)
    assert atomic.follow(client, name, pending).outcome == "follow"
    assert isinstance(atomic.hand_over(holder, 5000), atomic.Handed)
    client.delete(name)
    holder = RedisLock(client, name, timeout=5)
    assert holder.acquire(blocking=False)
    atomic.replace(client, name, pending._replace(task_id="task-9"), running=True, lease_ms=5000)
    atomic.hand_over(holder, 5000, (done, "task-10", 60_000))
    atomic.adopt(client, name, 5000)
    client.delete(name)
    stacked = RedisLock(client, stacked_name, timeout=5, stack=stack)
    assert stacked.acquire(blocking=False)
    atomic.hand_over(stacked, 5000)
    stacked = RedisLock(client, stacked_name, timeout=5, stack=stack)
    assert stacked.acquire(blocking=False)
    atomic.hand_over(stacked, 5000, (companion_key(stacked_name, DONE), "task-11", 60_000))
    burst = atomic.debounce_join(client, name, "task-12", quiet_ms=100, max_wait_ms=0,
                                 keep_ms=60_000)  # fmt: skip
    atomic.debounce_run(client, name, burst.task_id, str(burst.generation), keep_ms=60_000)

    # Park and order.
    parked_name = f"sc:{{{tag}p}}"
    holder = RedisLock(client, parked_name, timeout=5)
    assert holder.acquire(blocking=False)
    turn = atomic.order_take(client, parked_name, "task-13", rank=0, keep_ms=60_000)
    atomic.order_turn(client, parked_name, "task-13", turn=turn, slots=1, keep_ms=60_000,
                      lease_ms=5000)  # fmt: skip
    parked = atomic.park(client, parked_name, "task-13", turn=None, token="q-task-13",
                         info="{}", payload=b"call", keep_ms=60_000, grant_ms=5000)  # fmt: skip
    assert parked.position == 1
    assert isinstance(atomic.park_release(holder, 5000), atomic.ParkedCall)
    atomic.park_started(client, parked_name, "task-13")
    atomic.park_sweep(client, parked_name, restart_ms=60_000, grant_ms=5000, most=10)
    atomic.order_leave(client, parked_name, "task-13")
    client.delete(parked_name)
    for record, ordered in (((done, "task-14", 60_000), "task-14"), (None, None)):
        holder = RedisLock(client, parked_name, timeout=5)
        assert holder.acquire(blocking=False)
        atomic.park_release(holder, 5000, record, ordered=ordered)
    stacked = RedisLock(client, stacked_name, timeout=5, stack=stack)
    assert stacked.acquire(blocking=False)
    atomic.park_release(stacked, 5000)
    atomic.index_drop(client, f"{{{tag}}}~parking", "task\nkey", before=0)

    # Calls held back until they fit (a limit full, then a window).
    full = [RedisLock(client, f"{prefix}:job{i}:{{{prefix}:stack}}", timeout=5, stack=stack)
            for i in range(4)]  # fmt: skip
    assert all(lock.acquire(blocking=False) for lock in full)
    base = stack_base(prefix)
    assert atomic.held_park(client, base, "task-15", key=stacked_name, payload=b"t\ncall",
                            keep_ms=60_000, stack=stack, place="q-task-15",
                            place_ms=5000) == "global"  # fmt: skip
    assert atomic.held_park(client, base, "task-16", key=name, payload=b"t\ncall",
                            keep_ms=60_000, due_ms=60_000) == ""  # fmt: skip
    for lock in full:
        lock.release()
    for tasks in ((), ("t", "u")):
        atomic.held_sweep(client, base, restart_ms=60_000, place_ms=5000, travel_ms=5000,
                          most=10, tasks=tasks)  # fmt: skip
    assert atomic.held_started(client, base, "task-15")

    # A beat group: a leader's claim, sent and given back, and the replicas' heartbeats.
    keys = beat.BeatKeys(f"sc:beat:{{{tag}b}}")
    leader = RedisLock(client, keys.leader, timeout=5)
    assert leader.acquire(blocking=False)
    token, fence = leader.token or "", leader.fencing_token or 0
    for slot_ms, sent in ((1_000, True), (2_000, False)):
        beat.claim(client, keys, token=token, fence=fence, entry="tick", slot_ms=slot_ms,
                   send=True, keep_ms=60_000)  # fmt: skip
        beat.settle(client, keys, entry="tick", slot_ms=slot_ms, fence=fence, sent=sent)
    beat.presence(client, keys, replica="r1", info="{}", ttl_ms=5000, keep_ms=60_000)
    beat.leave(client, keys, replica="r1", keep_ms=60_000)

    # The asyncio lock builds its calls with the same code; its calls are checked too.
    async def aio() -> None:
        async_client = redis.asyncio.Redis.from_url(url)
        try:
            async_lock = AsyncRedisLock(async_client, f"sc:{{{tag}a}}", timeout=5)
            assert await async_lock.acquire(blocking=False)
            await async_lock.extend()
            await async_lock.release()
        finally:
            await async_client.aclose()

    asyncio.run(aio())


@pytest.fixture
def seen(redis_server: RedisServer) -> list[list[str]]:
    """Every EVALSHA the server ran while every wrapper was driven, as its words."""
    monitor = Monitor(redis_server)
    marker = uuid.uuid4().hex
    found: list[list[str]] = []
    reader = threading.Thread(
        target=lambda: found.extend(w for w in monitor.until(marker) if w[0].upper() == "EVALSHA"),
        daemon=True,
    )
    reader.start()
    client = redis.Redis.from_url(redis_server.url)
    try:
        drive_every_wrapper(client, redis_server.url)
        client.echo(marker)
        reader.join(MONITOR_BOUND)
        assert not reader.is_alive(), "the server's MONITOR feed never showed the end marker"
    finally:
        client.close()
        monitor.close()
    return found


def test_every_call_passes_what_its_script_s_header_says(seen: list[list[str]]) -> None:
    """Each EVALSHA carries a number of KEYS and ARGV its script's contract allows, and
    every registered script was called."""
    by_sha = {script.sha: name for name, script in SCRIPTS.items()}
    called: dict[str, set[tuple[int, int]]] = {}
    problems = []
    for words in seen:
        name = by_sha[words[1]]
        numkeys = int(words[2])
        argv = len(words) - 3 - numkeys
        called.setdefault(name, set()).add((numkeys, argv))
        text = contract(name)
        keys, args = arity(text, "KEYS"), arity(text, "ARGV")
        if not (keys.low <= numkeys <= keys.high and args.low <= argv <= args.high):
            problems.append(
                f"{name}: sent {numkeys} KEYS and {argv} ARGV; its header says "
                f"KEYS {keys.low}-{keys.high}, ARGV {args.low}-{args.high}"
            )
    assert not problems, "\n".join(sorted(set(problems)))
    assert set(called) == set(SCRIPTS), f"never called: {set(SCRIPTS) - set(called)}"

"""Debounce (``lock_debounce=T``, ``lock_debounce_max_wait=M``): calls of one key closer than
T apart form a burst that runs once, T after its last call (at the latest M after its
first), with the last call's arguments; every call of the burst gets the same AsyncResult.

It is decided in Redis when the call is made. A burst is a hash beside the lock key,
``<base>debounce``: its task id, a generation (bumped by every call) and the time its run is
due (server clock). Every call publishes a message under the burst's task id, carrying its
generation, with a countdown to the due time. When a message is delivered, one script
compares its generation with the burst's: the latest one marks the burst as run and runs (under the
task's lock, as any run; a second delivery of it does not run again); an older one ends
without running (``Ignore``: no result is
stored, so the burst's AsyncResult gets the real run's). A call made once the burst is due
starts a new burst. Nothing here relies on ``revoke`` (which lives in worker memory).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from celery.exceptions import Ignore

from celery_singleton_lock.engine.keyspace import companion_key
from celery_singleton_lock.engine.scripted import _Script
from celery_singleton_lock.engine.wire import LockClient, call

__all__ = ["HEADER_DEBOUNCE", "Burst", "end_stale", "is_latest", "join"]

log = logging.getLogger("celery_singleton_lock.task")

#: Message header with the burst generation a debounced call published.
HEADER_DEBOUNCE = "singleton_lock_debounce"
#: A burst's record outlives its due time by this much (its run reads it when it starts).
_KEEP_MS = 3_600_000

JOIN = """
-- KEYS[1] the burst record (hash: id, gen, first, due, ran)
-- ARGV[1] this call's task id, ARGV[2] the quiet time T (ms), ARGV[3] the longest a burst
-- may be put off after its first call M (ms; 0: no limit), ARGV[4] how long past its due
-- time the record is kept (ms)
-- returns {burst task id, generation of this call, ms until the burst's run is due}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local burst = redis.call('HMGET', KEYS[1], 'id', 'gen', 'first', 'due', 'ran')
local id, gen, first = ARGV[1], 1, now
if burst[1] and burst[5] ~= '1' and tonumber(burst[4]) > now then
  id, gen, first = burst[1], tonumber(burst[2]) + 1, tonumber(burst[3])
end
local due = now + tonumber(ARGV[2])
if tonumber(ARGV[3]) > 0 then due = math.min(due, first + tonumber(ARGV[3])) end
redis.call('HSET', KEYS[1], 'id', id, 'gen', gen, 'first', first, 'due', due, 'ran', '0')
redis.call('PEXPIRE', KEYS[1], due - now + tonumber(ARGV[4]))
return {id, gen, due - now}
"""

RUN = """
-- KEYS[1] the burst record
-- ARGV[1] the delivered message's task id, ARGV[2] its generation
-- returns 1 when it is the burst's latest call, delivered for the first time (the burst is
-- closed: it runs; a call made from now on opens a new burst), else 0
local burst = redis.call('HMGET', KEYS[1], 'id', 'gen', 'ran')
if not burst[1] then return 1 end  -- no record left (a restart): run rather than lose it
if burst[1] ~= ARGV[1] or burst[2] ~= ARGV[2] or burst[3] == '1' then return 0 end
redis.call('HSET', KEYS[1], 'ran', '1')
return 1
"""

_JOIN = _Script(JOIN)
_RUN = _Script(RUN)


class Burst(NamedTuple):
    """Where one debounced call went: the burst's task id, this call's generation in it,
    and the seconds until the burst's run is due."""

    task_id: str
    generation: int
    countdown: float


def burst_key(key: str) -> str:
    """The burst record of lock ``key``."""
    return companion_key(key, "debounce")


def join(client: LockClient, key: str, task_id: str, quiet: float, max_wait: float | None) -> Burst:
    """Add one call (``task_id``) to the open burst of ``key``, or open one."""
    reply = call(key, _JOIN, client, 1, burst_key(key), task_id, max(1, round(quiet * 1000)),
                 round((max_wait or 0) * 1000), _KEEP_MS)  # fmt: skip
    found = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    return Burst(found, int(reply[1]), max(0.0, int(reply[2]) / 1000))


def is_latest(client: LockClient, key: str, *, task_id: str, generation: Any) -> bool:
    """At delivery: whether this message is its burst's latest call, delivered for the first
    time (then the burst is marked as run, and this run goes ahead)."""
    return int(call(key, _RUN, client, 1, burst_key(key), task_id, str(generation))) == 1


def end_stale(task: Any, task_id: str, generation: Any) -> None:
    """End a stale message of a burst without running it (``Ignore``: nothing is stored, so
    the burst's AsyncResult gets the real run's result)."""
    log.info("%s[%s] not run: debounced (generation %s is stale)", task.name, task_id, generation)
    raise Ignore

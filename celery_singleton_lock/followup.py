"""Pending follow-ups of queue-scope locks (``lock_on_conflict="coalesce"`` and ``"replace"``).

A follow-up is the one call that runs after the current holder of a key. It is a hash beside
the lock, ``<base>pending``: its task id, the owner token and holder info its queue lock
will carry, and the call itself (serialized arguments, publish options). The first call made
while the key is held creates it under its own task id; later calls replace its arguments
and options but keep that task id, so every one of them gets the same ``AsyncResult``. When
the holder's run ends, one script checks that the holder still owns the lock, writes the
lock for the follow-up's queue token (a new fencing token, the queue lease), deletes the
hash and hands the call back; the releasing process publishes it under that task id, past
the lock. Nobody else can consume the hash, so the follow-up is published once.

``replace`` goes further while the holder is still *queued* (its message not yet running):
the new call takes the lock over at once (a new fencing token), the superseded task id is
marked in Redis and stored as REVOKED in the result backend, and when its message is
delivered it ends without running (``Ignore``: nothing overwrites the REVOKED state). A
running holder is left to finish and the new call becomes its follow-up, unless
``lock_replace_running`` asks to revoke it (terminate) and take the lock over at once.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from celery.exceptions import Ignore
from kombu.serialization import dumps, loads

from celery_singleton_lock.engine import RedisLock, companion_key
from celery_singleton_lock.engine._scripts import _PARSE, GRACE_BASE_MS, GRACE_FRACTION
from celery_singleton_lock.engine.scripted import _Script
from celery_singleton_lock.engine.wire import call
from celery_singleton_lock.options import LockOptions

if TYPE_CHECKING:
    from celery_singleton_lock.runtime import TaskLocking

__all__ = ["Followup", "Takeover", "call_or_follow", "hand_over", "superseded_by"]

log = logging.getLogger("celery_singleton_lock.task")

#: The publish options a follow-up keeps (routing); a countdown or eta of the call that
#: created it is not kept: a follow-up runs when its holder ends.
KEPT_OPTIONS = ("queue", "routing_key", "exchange", "priority", "headers", "serializer")

_HELD = (
    _PARSE
    + """
local function held(key, now)
  local current = redis.call('GET', key)
  if not current then return false, nil end
  local held_until = parse(current)
  if held_until == nil then return redis.call('PTTL', key) > 0, current end
  return held_until > now, current
end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function pend(key, ARGV, first)
  if redis.call('HEXISTS', key, 'id') == 0 then
    redis.call('HSET', key, 'id', ARGV[first], 'token', ARGV[first + 1], 'info', ARGV[first + 2])
  end
  redis.call('HSET', key, 'body', ARGV[first + 3], 'ctype', ARGV[first + 4],
    'encoding', ARGV[first + 5], 'options', ARGV[first + 6])
  redis.call('PEXPIRE', key, tonumber(ARGV[first + 7]))
  return redis.call('HGET', key, 'id')
end
local function write(key, token, fence, info, now, lease)
  redis.call('SET', key, string.format('%.0f', now + lease) .. ':0:' .. token .. ':'
    .. string.format('%.0f', fence) .. ':' .. info,
    'PX', lease + GRACE_BASE_MS + math.floor(lease / GRACE_FRACTION))
end
"""
)

CALL = (
    _HELD
    + """
-- KEYS[1] lock key, KEYS[2] pending follow-up (hash)
-- ARGV[1] this call's task id, ARGV[2] its queue owner token, ARGV[3] its holder info,
-- ARGV[4] serialized arguments, ARGV[5] content type, ARGV[6] content encoding,
-- ARGV[7] kept publish options (JSON), ARGV[8] how long a follow-up is kept (ms)
-- returns {1, task id}: the lock is held; this call is (now) its follow-up: publish nothing
--         {2, task id, token, info}: the lock is free but a follow-up was left behind (its
--            holder ended without handing over): take the lock for that task id and publish
--            this call under it
--         {0}: the lock is free: take it as usual
local now = clock()
if held(KEYS[1], now) then
  return {1, pend(KEYS[2], ARGV, 1)}
end
local left = redis.call('HMGET', KEYS[2], 'id', 'token', 'info')
if left[1] then
  redis.call('DEL', KEYS[2])
  return {2, left[1], left[2], left[3]}
end
return {0}
"""
)

HAND_OVER = (
    _HELD
    + """
-- KEYS[1] lock key, KEYS[2] pending follow-up, KEYS[3] (optional) where to record who
-- finished
-- ARGV[1] owner token of the run that ends, ARGV[2] the follow-up's queue lease (ms),
-- ARGV[3] the value to record in KEYS[3], ARGV[4] its TTL ms
-- returns {0}: not owned, or no follow-up (release as usual)
--         {1, task id, arguments, content type, encoding, options}: the lock now belongs to
--            the follow-up's queue token; publish it
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
local token, fence = string.match(current, '^%d+:[01]:([^:]*):(%d+):')
if token ~= ARGV[1] then return {0} end
local p = redis.call('HMGET', KEYS[2], 'id', 'token', 'info', 'body', 'ctype', 'encoding',
  'options')
if not p[1] then return {0} end
redis.call('DEL', KEYS[2])  -- first: a write that never needs memory
local now, now_us = clock()
write(KEYS[1], p[2], math.max(now_us, tonumber(fence) + 1), p[3], now, tonumber(ARGV[2]))
if KEYS[3] then redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[4])) end
return {1, p[1], p[4], p[5], p[6], p[7]}
"""
)

REPLACE = (
    _HELD
    + """
-- KEYS[1] lock key, KEYS[2] pending follow-up
-- ARGV[1..8] as CALL, ARGV[9] '1' to take a running holder's lock over too (it is revoked),
-- ARGV[10] the queue lease (ms) of this call's lock
-- returns {0}: the lock is free: take it as usual
--         {1, superseded task id}: the holder was still queued: the lock is this call's now
--            (a new fencing token); publish it; the superseded message will not run
--         {2, task id}: the holder runs: this call is (now) its follow-up
--         {3, superseded task id}: the holder runs and ARGV[9] is '1': the lock is this
--            call's now; revoke the holder and publish this call
local now, now_us = clock()
local is_held, current = held(KEYS[1], now)
if not is_held then return {0} end
local token, fence, info = string.match(current, '^%d+:[01]:([^:]*):(%d+):(.*)$')
local ok, holder = pcall(cjson.decode, info or '')
if not token or not ok or type(holder) ~= 'table' or not holder.task_id then
  return {2, pend(KEYS[2], ARGV, 1)}  -- a holder we cannot supersede: follow it
end
if holder.queued ~= true and ARGV[9] ~= '1' then
  return {2, pend(KEYS[2], ARGV, 1)}
end
local base = string.sub(KEYS[2], 1, -8)
write(KEYS[1], ARGV[2], math.max(now_us, tonumber(fence) + 1), ARGV[3], now, tonumber(ARGV[10]))
redis.call('SET', base .. 'superseded:' .. holder.task_id, ARGV[1], 'PX', tonumber(ARGV[10]))
redis.call('DEL', KEYS[2])
return {holder.queued == true and 1 or 3, holder.task_id}
"""
)


def _constants(source: str) -> str:
    return source.replace("GRACE_BASE_MS", str(GRACE_BASE_MS)).replace(
        "GRACE_FRACTION", str(GRACE_FRACTION)
    )


_CALL = _Script(_constants(CALL))
_HAND_OVER = _Script(_constants(HAND_OVER))
_REPLACE = _Script(_constants(REPLACE))


def pending_key(key: str) -> str:
    """The follow-up of lock ``key``."""
    return companion_key(key, "pending")


def superseded_key(key: str, task_id: str) -> str:
    """Set (to the replacing task id) when ``task_id``'s queued call was superseded."""
    return companion_key(key, f"superseded:{task_id}")


class Followup(NamedTuple):
    """What a call under coalesce or replace came to."""

    outcome: str  # "take" (lock free: acquire as usual), "adopt", "follow", "superseded",
    #               "revoke" (see REPLACE)
    task_id: str | None = None  # the follow-up's, the adopted one's or the superseded one's


class Takeover(NamedTuple):
    """A follow-up handed the lock at the end of its holder's run, to be published."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def _call_args(
    locking: TaskLocking, app: Any, key: str, task_id: str, *, args: Any, kwargs: Any,
    options: dict[str, Any],
) -> tuple[Any, ...]:  # fmt: skip
    """The CALL/REPLACE arguments of one call: the follow-up it would become."""
    lock = locking.new_lock(app, key, task_id, queued=True)
    serializer = options.get("serializer") or locking.serializer
    content_type, encoding, body = dumps([list(args or ()), dict(kwargs or {})],
                                         serializer=serializer)  # fmt: skip
    kept = {name: options[name] for name in KEPT_OPTIONS if options.get(name) is not None}
    keep_ms = max(1, int(max(locking.options.queue_timeout, 86_400) * 1000))
    return (
        task_id, lock.token or "", lock.holder_info, body, content_type, encoding,
        json.dumps(kept, default=str), keep_ms,
    )  # fmt: skip


def call_or_follow(
    locking: TaskLocking, app: Any, key: str, task_id: str, *, args: Any, kwargs: Any,
    options: dict[str, Any], replace: bool,
) -> Followup:  # fmt: skip
    """One call under coalesce (or replace): whether it may take the lock as usual, must
    take it for a follow-up left behind, became the pending follow-up, or superseded the
    queued holder (see the module docstring)."""
    client = locking.client(app)
    argv = _call_args(locking, app, key, task_id, args=args, kwargs=kwargs, options=options)
    if replace:
        running = b"1" if locking.options.replace_running else b"0"
        lease_ms = max(1, int(locking.options.queue_timeout * 1000))
        reply = call(key, _REPLACE, client, 2, key, pending_key(key), *argv, running, lease_ms)
        outcome = {0: "take", 1: "superseded", 2: "follow", 3: "revoke"}[int(reply[0])]
    else:
        reply = call(key, _CALL, client, 2, key, pending_key(key), *argv)
        outcome = {0: "take", 1: "follow", 2: "adopt"}[int(reply[0])]
    found = reply[1] if len(reply) > 1 else None
    return Followup(outcome, found.decode() if isinstance(found, bytes) else found)


def hand_over(
    options: LockOptions, lock: RedisLock, record: tuple[str, str, int] | None = None
) -> Takeover | None:
    """At the end of the run that holds ``lock`` (or for a run that was lost): give the lock
    to the pending follow-up, if any, and return it for publishing; None when there is none
    (release as usual). ``record`` (key, value, TTL ms) notes that the run finished."""
    token = lock.token
    if token is None:
        return None
    lease_ms = max(1, int(options.queue_timeout * 1000))
    if record is None:
        reply = call(lock.name, _HAND_OVER, lock.client, 2, lock.name, pending_key(lock.name),
                     token, lease_ms)  # fmt: skip
    else:
        reply = call(lock.name, _HAND_OVER, lock.client, 3, lock.name, pending_key(lock.name),
                     record[0], token, lease_ms, record[1], record[2])  # fmt: skip
    if int(reply[0]) != 1:
        return None
    task_id, body, content_type, encoding, kept = (
        part.decode() if isinstance(part, bytes) else part for part in reply[1:]
    )
    args, kwargs = loads(body, content_type, encoding, accept={content_type})
    lock.detach()
    return Takeover(task_id, tuple(args), dict(kwargs), json.loads(kept))


def superseded_by(lock: RedisLock, task_id: str) -> str | None:
    """The task id that superseded ``task_id``'s queued call of ``lock``'s key, if any."""
    found = call(lock.name, lock.client.get, superseded_key(lock.name, task_id))
    return found.decode() if isinstance(found, bytes) else found


def end_superseded(task: Any, task_id: str, by: str) -> None:
    """A superseded message was delivered: it ends without running (its REVOKED state,
    stored when it was superseded, stays)."""
    log.info("%s[%s] not run: superseded by %s", task.name, task_id, by)
    raise Ignore

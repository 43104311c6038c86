"""Lua sources of the modes (issue 16): the cluster-wide throttle and the success hold.

Same conventions as ``_scripts``: each script is headed by its KEYS / ARGV / return
contract, reads the clock with ``TIME`` on the server, touches only keys in the lock's Redis
Cluster hash slot (``companion_key`` of the lock key) and makes a write that never needs
memory before any write that may (so it still works at ``maxmemory`` with ``noeviction``).

**The throttle** keeps, beside each lock key, the sorted set ``<base>starts`` of the starts
admitted in the last window: one member per start, scored with the server time of that
start in milliseconds. A start at ``now`` is admitted when fewer than N members are newer
than ``now - window``; then no half-open window ``[t, t + window)`` ever holds more than N
starts (the last of N + 1 such starts would have seen the N others as newer than its own
``now - window``). Older members are pruned in the same script, and every admitted start
sets the set's TTL to one window and a second, so an idle key's set vanishes by itself.
"""

from __future__ import annotations

from celery_singleton_lock.engine._scripts import GRACE_BASE_MS, GRACE_FRACTION

__all__ = ["HOLD", "STARTS_SUFFIX", "STARTS_TTL_SLACK_MS", "THROTTLE"]

#: Suffix of the sorted set of recent starts of a lock key (``companion_key(key, ...)``).
STARTS_SUFFIX = "starts"
#: The starts set outlives the newest start by one window plus this.
STARTS_TTL_SLACK_MS = 1000

THROTTLE = """
-- KEYS[1] the starts of one lock key: sorted set <base>starts (score: server ms of a start)
-- ARGV[1] N, the most starts per window (>= 1), ARGV[2] the window ms,
-- ARGV[3] who starts (a task id; the server microseconds are appended: members are unique)
-- returns {1, starts in the window including this one}  admitted, and recorded
--         {0, ms until a start would be admitted (>= 1)}  over the limit: nothing recorded
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- first: a write that never needs memory (it only frees)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[3] .. ':' .. t[1] .. '.' .. t[2])
  redis.call('PEXPIRE', KEYS[1], window + STARTS_TTL_SLACK_MS)
  return {1, count + 1}
end
-- The start at rank count - limit (oldest first) must leave the window before another fits.
local gate = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
local wait = tonumber(gate[2]) + window - now
if wait < 1 then wait = 1 end
return {0, wait}
"""

HOLD = """
-- KEYS[1] lock key, KEYS[2] (optional) a key that records who finished last
-- ARGV[1] owner token, ARGV[2] hold ms (from server now), ARGV[3] holder info to keep,
-- ARGV[4], ARGV[5] (with KEYS[2]) the value to record and its TTL ms
-- returns the end of the hold (server ms), or 0 when not owned (nothing done)
-- The owner's hold becomes a hold of ARGV[2] ms that nobody renews: same owner token,
-- same fencing token, the waiters' flag kept (they take it over when it ends).
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, token, fence = string.match(current, '^%d+:([01]):([^:]*):(%d+):')
if token ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local hold = tonumber(ARGV[2])
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + hold
local ttl = hold + GRACE_BASE_MS + math.floor(hold / GRACE_FRACTION)
-- PEXPIRE first: a write that never needs memory (see the module docstring of _scripts)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[1], string.format('%.0f', expiry) .. ':' .. flag .. ':' .. token .. ':'
  .. fence .. ':' .. ARGV[3], 'PX', ttl)
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', tonumber(ARGV[5]))
end
return expiry
"""


def _constants(source: str) -> str:
    """``source`` with the constants written in (one definition each)."""
    for name, value in (
        ("STARTS_TTL_SLACK_MS", STARTS_TTL_SLACK_MS),
        ("GRACE_BASE_MS", GRACE_BASE_MS),
        ("GRACE_FRACTION", GRACE_FRACTION),
    ):
        source = source.replace(name, str(value))
    return source


THROTTLE, HOLD = _constants(THROTTLE), _constants(HOLD)

"""Lua sources of the lock protocol, run atomically on the Redis server.

Lock value layout (written by ``RedisLock``; ``:`` separated, holder info last)::

    <expiry ms>:<flag>:<owner token>:<fencing token>:<holder info>

``expiry`` is Redis server time in milliseconds at which the lease ends. ``flag`` is ``1``
once a waiter has seen the lock held (so the release must hand the lock over or wake
waiters) and ``0`` otherwise.

Waiters queue up beside the lock, in its hash slot: ``<name>:queue`` is a sorted set of their
owner tokens in the order they came (score: server microseconds at their first try), and
``<name>:waiter:<token>`` holds ``"<lease ms>:<holder info>"`` for as long as that waiter is
known to be blocked (its TTL: the time it blocks between tries, plus a slack). A release
hands the lock straight to the first queued waiter whose key still exists: it writes the
lock for that waiter and pushes ``"<fencing token>:<expiry ms>:<lock or slot key>"`` onto
the waiter's grant list ``<name>:grant:<token>``, which the waiter is blocked on, so the
waiter owns it without another round trip. Waiters whose key lapsed (gone, or about to try
again) are dropped as the queue is read.

At ``maxmemory`` (noeviction) Redis refuses a script's writes that may need memory until the
script has written once: so each script that must work there (release, extend)
makes a write that never needs memory first (``DEL``, ``PEXPIRE``, ``ZPOPMIN``).
"""

from __future__ import annotations

# Shared by every script: parse(value) -> expiry_ms | nil, flag_offset | nil, fence, token.
# The grammar, identical in _value.parse_value: numbers are 1 to 16 ASCII digits and at
# most 2^53 - 1 (exact as a Lua double); anything else at the key is a foreign value.
_PARSE = """
local MAX_EXACT = 9007199254740991
local function number(s)
  if string.len(s) > 16 then return nil end
  local n = tonumber(s)
  if n > MAX_EXACT then return nil end
  return n
end
local function parse(v)
  local digits, rest = string.match(v, '^(%d+)(.*)$')
  if not digits then return nil end
  local n = number(digits)
  if not n then return nil end
  if rest == '' then
    if n < 100000000000 then n = n * 1000 end
    return n, nil, 0, nil
  end
  local frac = string.match(rest, '^%.(%d+)$')
  if frac then
    if string.len(frac) > 16 then return nil end
    local x = tonumber(digits .. '.' .. frac)
    if x < 100000000000 then x = x * 1000 end
    return math.floor(x), nil, 0, nil
  end
  local flag, token, fence = string.match(rest, '^:([01]):([^:]*):(%d+):')
  if not flag then return nil end
  fence = number(fence)
  if not fence then return nil end
  return n, string.len(digits) + 1, fence, token
end
"""

#: How long a wake-up pushed onto the waiters' signal list survives unread.
SIGNAL_TTL_MS = 2000
#: The key outlives its lease by this much plus a tenth of the lease, so an abandoned key
#: vanishes on its own a little after the lease (the value, not the TTL, decides "held").
GRACE_BASE_MS = 1000
GRACE_FRACTION = 10
#: A queued waiter's place is kept this long past the time it said it would block: a waiter
#: wakes up (and tries again, which renews its place) a little late, never early.
WAITER_SLACK_MS = 500
#: A grant nobody picked up (its waiter died just before) vanishes after this long.
GRANT_TTL_MS = 60_000

# Keys are few on the wire: the caller's waiter key, grant list and the signal list are
# derived in the scripts from the queue key ``<base>queue`` (``<base>waiter:<token>``,
# ``<base>grant:<token>``, ``<base>signal``), all in the lock's hash slot.
# The uncontended acquire runs only TIME and SET NX: everything else comes after it.
_ACQUIRE_FAST = """
-- KEYS[1] lock key, KEYS[2] waiters' queue (sorted set) <base>queue
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] holder info,
-- ARGV[4] 'x' a non-blocking try (never queues, never flags), '0' a first blocking try
--         (queues when the lock is held), '1' a later try of a caller that may be queued
--         (leaves the queue when it gets the lock)
-- ARGV[5] the longest the caller blocks between tries (ms): how long its place is kept
-- ARGV[6] (optional) a claimed owner token: a hold under it is taken over as our own
--         (keeping its fencing token), as a delivery claims its queued message's lock
-- returns {1, fencing token, expiry ms} when acquired,
--         {0, ms until the holder's lease ends (>= 1)} when held by someone else
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
local expiry = now + lease
local ttl = lease + GRACE_BASE_MS + math.floor(lease / GRACE_FRACTION)
local head = string.format('%.0f', expiry) .. (ARGV[4] == '1' and ':1:' or ':0:') .. ARGV[1] .. ':'
-- pcall: at maxmemory the SET NX is refused even when the key exists; a contender must
-- still hear "held" then (a write we need below fails with the server's error)
local set = redis.pcall('SET', KEYS[1], head .. string.format('%.0f', fence) .. ':' .. ARGV[3],
  'NX', 'PX', ttl)
local function leave()
  if ARGV[4] == '1' then
    local base = string.sub(KEYS[2], 1, -6)
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('DEL', base .. 'waiter:' .. ARGV[1], base .. 'grant:' .. ARGV[1])
  end
end
if set and set.ok then
  leave()
  return {1, fence, expiry}
end
"""

ACQUIRE = (
    _ACQUIRE_FAST
    + _PARSE
    + """
local current = redis.call('GET', KEYS[1])
if current then
  local held_until, flag_at, old_fence, owner = parse(current)
  if owner == ARGV[1] or (ARGV[6] and owner == ARGV[6]) then
    fence = old_fence  -- our own hold (perhaps handed to us), or the one we claim: keep it
  elseif held_until == nil then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then return {0, left} end
  elseif held_until > now then
    if ARGV[4] ~= 'x' then
      -- Queueing is best effort at maxmemory (the server refuses these writes; the waiter
      -- then polls); any other refusal (an ACL denial) is the caller's error.
      local function soft(...)
        local reply = redis.pcall(...)
        if type(reply) == 'table' and reply.err and not string.find(reply.err, 'OOM', 1, true) then
          error(reply)
        end
      end
      if flag_at and string.sub(current, flag_at + 1, flag_at + 1) == '0' then
        soft('SETRANGE', KEYS[1], flag_at, '1')
      end
      local base = string.sub(KEYS[2], 1, -6)
      local keep = math.min(held_until - now, tonumber(ARGV[5])) + WAITER_SLACK_MS
      soft('ZADD', KEYS[2], 'NX', fence, ARGV[1])
      soft('SET', base .. 'waiter:' .. ARGV[1], ARGV[2] .. ':' .. ARGV[3], 'PX', keep)
      soft('PEXPIRE', KEYS[2], keep + 1000)
      redis.call('DEL', base .. 'grant:' .. ARGV[1])  -- left from an earlier hold of this wait
    end
    return {0, held_until - now}
  else
    if old_fence >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, old_fence + 1)
  end
end
redis.call('SET', KEYS[1], head .. string.format('%.0f', fence) .. ':' .. ARGV[3], 'PX', ttl)
leave()
return {1, fence, expiry}
"""
)

ACQUIRE_SLOTS = (
    _PARSE
    + """
-- A lock with N slots (lock_limit): slot 1 is the lock key, slot i >= 2 is <base>slot:<i>;
-- each slot holds an ordinary lock value. Takes our own or the claimed slot, else a free or
-- expired one, else queues the caller as ACQUIRE does.
-- KEYS[1] lock key (slot 1), KEYS[2] waiters' queue <base>queue
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] holder info, ARGV[4] mode (as ACQUIRE),
-- ARGV[5] the longest the caller blocks between tries (ms), ARGV[6] N, ARGV[7] a token
-- prefix no two slots may share ('' none: a task's deliveries never hold two slots),
-- ARGV[8] (optional) a claimed owner token
-- returns {1, fencing token, expiry ms, slot key} when acquired,
--         {0, ms until the first held slot's lease ends (>= 1)} when every slot is held
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
local ttl = lease + GRACE_BASE_MS + math.floor(lease / GRACE_FRACTION)
local base = string.sub(KEYS[2], 1, -6)
local slots = {KEYS[1]}
for i = 2, tonumber(ARGV[6]) do slots[i] = base .. 'slot:' .. i end
local values = redis.call('MGET', unpack(slots))
local group = ARGV[7]
local mine, free, kept, grouped, soonest = nil, nil, nil, false, nil
local flags = {}
for i, current in ipairs(values) do
  if not current then
    free = free or i
  else
    local held_until, flag_at, old_fence, owner = parse(current)
    local left = nil
    if owner == ARGV[1] or (ARGV[8] and owner == ARGV[8]) then
      mine, kept = i, old_fence
    elseif held_until == nil then
      left = redis.call('PTTL', slots[i])
      if left <= 0 then free = free or i; left = nil end
    elseif held_until > now then
      left = held_until - now
      if group ~= '' and owner and string.sub(owner, 1, string.len(group)) == group then
        grouped = true  -- another delivery of this task holds a slot
      end
      if flag_at and string.sub(current, flag_at + 1, flag_at + 1) == '0' then
        flags[#flags + 1] = {slots[i], flag_at}
      end
    else
      free = free or i  -- an expired lease
    end
    if left and (soonest == nil or left < soonest) then soonest = left end
  end
end
local function leave()
  if ARGV[4] == '1' then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('DEL', base .. 'waiter:' .. ARGV[1], base .. 'grant:' .. ARGV[1])
  end
end
local take = mine or ((not grouped) and free) or nil
if take then
  if mine then
    fence = kept
  else
    local last = tonumber(redis.call('GET', base .. 'fence') or 0)
    if last >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, last + 1)
    redis.call('SET', base .. 'fence', string.format('%.0f', fence), 'PX', ttl)
  end
  local expiry = now + lease
  redis.call('SET', slots[take], string.format('%.0f', expiry)
    .. (ARGV[4] == '1' and ':1:' or ':0:') .. ARGV[1] .. ':' .. string.format('%.0f', fence)
    .. ':' .. ARGV[3], 'PX', ttl)
  leave()
  return {1, fence, expiry, slots[take]}
end
if ARGV[4] ~= 'x' and not grouped then
  for _, flag in ipairs(flags) do redis.call('SETRANGE', flag[1], flag[2], '1') end
  local keep = math.min(soonest or 1, tonumber(ARGV[5])) + WAITER_SLACK_MS
  redis.call('ZADD', KEYS[2], 'NX', fence, ARGV[1])
  redis.call('SET', base .. 'waiter:' .. ARGV[1], ARGV[2] .. ':' .. ARGV[3], 'PX', keep)
  redis.call('PEXPIRE', KEYS[2], keep + 1000)
  redis.call('DEL', base .. 'grant:' .. ARGV[1])
end
return {0, math.max(1, soonest or 1)}
"""
)

RELEASE = """
-- KEYS[1] lock key (or, with slots, the slot this holder releases), KEYS[2] waiters' queue
-- <base>queue, KEYS[3] (optional) a key that records who finished last
-- ARGV[1] owner token, ARGV[2] the number of slots (1: a plain lock; more: the highest
-- token issued across slots is kept in <base>fence), ARGV[3] the value to record in
-- KEYS[3], ARGV[4] its TTL ms
-- returns 0 not owned (nothing done), 1 released, 2 released and waiters signalled,
--         3 handed over to the first live waiter
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, token, fence = string.match(current, '^%d+:([01]):([^:]*):(%d+):')
if token ~= ARGV[1] then return 0 end
local function finished()
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[4]))
  end
end
if flag == '0' then
  redis.call('DEL', KEYS[1])
  finished()
  return 1
end
local base = string.sub(KEYS[2], 1, -6)
-- ZPOPMIN comes first: a write that never needs memory (see the module docstring)
for _ = 1, 16 do
  local waiter = redis.call('ZPOPMIN', KEYS[2])[1]
  if not waiter then break end
  local wants = redis.call('GET', base .. 'waiter:' .. waiter)
  if wants then
    local lease, info = string.match(wants, '^(%d+):(.*)$')
    lease = tonumber(lease)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local next_fence = math.max(tonumber(t[1]) * 1000000 + tonumber(t[2]), tonumber(fence) + 1)
    local ttl = lease + GRACE_BASE_MS + math.floor(lease / GRACE_FRACTION)
    if ARGV[2] ~= '1' then
      next_fence = math.max(next_fence, tonumber(redis.call('GET', base .. 'fence') or 0) + 1)
      redis.call('SET', base .. 'fence', string.format('%.0f', next_fence), 'PX', ttl)
    end
    local expiry = string.format('%.0f', now + lease)
    next_fence = string.format('%.0f', next_fence)
    local more = redis.call('ZCARD', KEYS[2]) > 0 and ':1:' or ':0:'
    redis.call('SET', KEYS[1], expiry .. more .. waiter .. ':' .. next_fence .. ':' .. info,
      'PX', ttl)
    local grant = base .. 'grant:' .. waiter
    redis.call('RPUSH', grant, next_fence .. ':' .. expiry .. ':' .. KEYS[1])
    redis.call('PEXPIRE', grant, GRANT_TTL_MS)
    finished()
    return 3
  end
end
redis.call('DEL', KEYS[1])  -- first: a write that never needs memory
finished()
redis.call('RPUSH', base .. 'signal', '1')
redis.call('PEXPIRE', base .. 'signal', SIGNAL_TTL_MS)
return 2
"""

EXTEND = """
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] new lease ms (from server now)
-- returns the new expiry ms, or 0 when not owned (nothing done)
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local digits, token = string.match(current, '^(%d+):[01]:([^:]*):')
if token ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local lease = tonumber(ARGV[2])
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local rest = string.sub(current, string.len(digits) + 1)
local ttl = lease + GRACE_BASE_MS + math.floor(lease / GRACE_FRACTION)
-- PEXPIRE first: a write that never needs memory. Once a script has written, Redis lets its
-- later writes through even at maxmemory, so a holder can renew while the server refuses
-- writes that grow memory (the same value length: the SET does not grow it).
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[1], string.format('%.0f', expiry) .. rest, 'PX', ttl)
return expiry
"""


def _constants(source: str) -> str:
    """``source`` with the protocol constants written in (one definition, here)."""
    for name in ("SIGNAL_TTL_MS", "GRACE_BASE_MS", "GRACE_FRACTION", "WAITER_SLACK_MS",
                 "GRANT_TTL_MS"):  # fmt: skip
        source = source.replace(name, str(globals()[name]))
    return source


ACQUIRE, RELEASE, EXTEND = _constants(ACQUIRE), _constants(RELEASE), _constants(EXTEND)
ACQUIRE_SLOTS = _constants(ACQUIRE_SLOTS)

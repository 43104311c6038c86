"""Lua sources of the lock protocol, run atomically on the Redis server.

Lock value layout (written by ``RedisLock``; ``:`` separated, holder info last)::

    <expiry ms>:<flag>:<owner token>:<fencing token>:<holder info>

``expiry`` is Redis server time in milliseconds at which the lease ends. ``flag`` is ``1``
once a waiter has seen the lock held (so the release must wake waiters) and ``0`` otherwise.
A value that is just an integer (or a decimal) is a classic SETNX locker's expiry timestamp:
seconds when below 10^11, else milliseconds. Any other value is foreign: it is held while
the key has a TTL and abandoned when it has none.

Every script reads the clock with ``TIME`` (the server's clock, never the client's). Redis 5+
replicates script effects, not the script, so calling ``TIME`` before a write is safe.
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

ACQUIRE = (
    _PARSE
    + """
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] key TTL beyond the lease (ms),
-- ARGV[4] '1' if this client has been waiting (written as the flag), '0' if not, 'x' for a
--         non-blocking try (flag '0', and a failure does not ask for a wake-up)
-- ARGV[5] holder info
-- ARGV[6] a claimed owner token ('' for none): a hold under it is taken over as our own
--         (keeping its fencing token), as a delivery claims its queued message's lock
-- returns {1, fencing token, expiry ms} when acquired,
--         {0, ms until the holder's lease ends (>= 1)} when held by someone else
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local expiry = now + lease
local flag = ARGV[4] == 'x' and '0' or ARGV[4]
local function value(f)
  return string.format('%.0f', expiry) .. ':' .. flag .. ':' .. ARGV[1] .. ':'
    .. string.format('%.0f', f) .. ':' .. ARGV[5]
end
if redis.call('SET', KEYS[1], value(fence), 'NX', 'PX', lease + tonumber(ARGV[3])) then
  return {1, fence, expiry}
end
local current = redis.call('GET', KEYS[1])
if current then
  local held_until, flag_at, old_fence, owner = parse(current)
  if owner == ARGV[1] or (ARGV[6] ~= '' and owner == ARGV[6]) then
    fence = old_fence  -- our own hold, or the one we claim: keep its fencing token
  elseif held_until == nil then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then return {0, ttl} end
  elseif held_until > now then
    if flag_at and ARGV[4] ~= 'x' and string.sub(current, flag_at + 1, flag_at + 1) == '0' then
      redis.call('SETRANGE', KEYS[1], flag_at, '1')
    end
    return {0, held_until - now}
  else
    if old_fence >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, old_fence + 1)
  end
end
redis.call('SET', KEYS[1], value(fence), 'PX', lease + tonumber(ARGV[3]))
return {1, fence, expiry}
"""
)

RELEASE = """
-- KEYS[1] lock key, KEYS[2] waiters' signal list
-- ARGV[1] owner token, ARGV[2] signal TTL ms
-- returns 0 not owned (nothing done), 1 released, 2 released and a waiter was signalled
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, token = string.match(current, '^%d+:([01]):([^:]*):')
if token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if flag == '1' then
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 2
end
return 1
"""

EXTEND = """
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] new lease ms (from server now), ARGV[3] key TTL beyond it (ms)
-- returns the new expiry ms, or 0 when not owned (nothing done)
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local digits, token = string.match(current, '^(%d+):[01]:([^:]*):')
if token ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local rest = string.sub(current, string.len(digits) + 1)
redis.call('SET', KEYS[1], string.format('%.0f', expiry) .. rest,
  'PX', tonumber(ARGV[2]) + tonumber(ARGV[3]))
return expiry
"""

-- ACQUIRE: take the lock (SET NX, else take over an expired value, as the classic SETNX /
-- GETSET recipe does), or, when it is held, queue the caller as a waiter.
-- KEYS[1] lock key, KEYS[2] waiters' queue (sorted set) <base>${K_QUEUE}
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] holder info,
-- ARGV[4] 'x' a non-blocking try (never queues, never flags), '0' a first blocking try
--         (queues when the lock is held), '1' a later try of a caller that may be queued
--         (leaves the queue when it gets the lock)
-- ARGV[5] the longest the caller blocks between tries (ms): how long its place is kept
-- ARGV[6] (optional) a claimed owner token: a hold under it is taken over as our own
--         (keeping its fencing token), as a delivery claims its queued message's lock
--         ('' none)
-- ARGV[7] (optional) stacked limits (lib/stack.lua): the lock is taken only together with
--         a share of each, in this step, or not at all ('' none)
-- ARGV[8] (optional) a task id: when the key's done set (lib/finished.lua) records that its
--         run finished, nothing is taken (a late copy of a finished message)
-- returns {1, fencing token, expiry ms} when acquired, {2} when ARGV[8]'s run finished,
--         {0, ms until the holder's lease ends (>= 1)} when held by someone else,
--         {0, ms until a share of it ends (>= 1), limit name} when the key is free (or
--         ours) but the weight does not fit in that limit
--         {0, 0, limit name, its number, the weight} when the key is free (or ours) but the
--         weight is above that limit's number (not 0: a pause): it can never fit, so the
--         try is refused (the caller leaves the waiters' queue and its limits' lines)
--@include clock
--@include lease
--@include value
--@include base
--@include waiters
--@include stack
-- The uncontended acquire runs only TIME and SET NX: everything else comes after it.
local now, fence = clock()
local now_us = fence
local lease = tonumber(ARGV[2])
local expiry = now + lease
local ttl = key_ttl(lease)
local flag = ARGV[4] == '1' and '1' or '0'
local claim = ARGV[6] ~= '' and ARGV[6] or nil
local stack = stack_spec(ARGV[7])
if ARGV[8] and ARGV[8] ~= '' and redis.call('ZSCORE', base(KEYS[1]) .. '${K_DONE}', ARGV[8]) then
  return {2}
end
-- pcall: at maxmemory the SET NX is refused even when the key exists; a contender must
-- still hear "held" then (a write we need below fails with the server's error)
local set = not stack and redis.pcall('SET', KEYS[1],
  format_value(expiry, flag, ARGV[1], fence, ARGV[3]), 'NX', 'PX', ttl)
if set and set.ok then
  if ARGV[4] == '1' then leave(base(KEYS[1]), KEYS[2], ARGV[1]) end
  return {1, fence, expiry}
end
local current = redis.call('GET', KEYS[1])
if current then
  local held_until, flag_at, old_fence, owner = parse(current)
  if owner == ARGV[1] or (claim and owner == claim) then
    fence = old_fence  -- our own hold (perhaps handed to us), or the one we claim: keep it
  elseif held_until == nil then
    -- A foreign value (not ours, not a classic timestamp): held while it has a TTL, and
    -- never overwritten silently when it has none.
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then return {0, left} end
    return redis.error_reply('${FOREIGN_VALUE}' .. KEYS[1])
  elseif held_until > now then
    if ARGV[4] ~= 'x' then
      -- Queueing is best effort at maxmemory (the server refuses these writes; the waiter
      -- then polls); any other refusal (an ACL denial) is the caller's error.
      local function soft(reply)
        if type(reply) == 'table' and reply.err and not string.find(reply.err, 'OOM', 1, true) then
          error(reply)
        end
      end
      if flag_at and string.sub(current, flag_at + 1, flag_at + 1) == '0' then
        soft(redis.pcall('SETRANGE', KEYS[1], flag_at, '1'))
      end
      local b = base(KEYS[1])
      local keep = math.min(held_until - now, tonumber(ARGV[5])) + ${WAITER_SLACK_MS}
      soft(redis.pcall('ZADD', KEYS[2], 'NX', fence, ARGV[1]))
      soft(redis.pcall('SET', b .. '${K_WAITER}' .. ARGV[1], ARGV[2] .. ':' .. ARGV[3], 'PX', keep))
      soft(redis.pcall('PEXPIRE', KEYS[2], keep + 1000))
      redis.call('DEL', b .. '${K_GRANT}' .. ARGV[1])  -- left from an earlier hold of this wait
    end
    return {0, held_until - now}
  else
    if old_fence >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, old_fence + 1)
  end
end
if stack then
  local limit, wait, heavy, number = stack_blocked(stack, ARGV[1], now, now_us,
    ARGV[4] ~= 'x' and tonumber(ARGV[5]) + ${WAITER_SLACK_MS} or nil, claim)
  if heavy then
    if ARGV[4] == '1' then leave(base(KEYS[1]), KEYS[2], ARGV[1]) end
    stack_unline(stack, ARGV[1], claim)
    return {0, 0, heavy, number, stack.w}
  end
  if limit then return {0, wait, limit} end
end
redis.call('SET', KEYS[1], format_value(expiry, flag, ARGV[1], fence, ARGV[3]), 'PX', ttl)
if stack then stack_take(base(KEYS[1]), stack, ARGV[7], ARGV[1], expiry, ttl, claim) end
if ARGV[4] == '1' then leave(base(KEYS[1]), KEYS[2], ARGV[1]) end
return {1, fence, expiry}

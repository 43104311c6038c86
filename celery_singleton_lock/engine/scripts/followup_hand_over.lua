-- FOLLOWUP_HAND_OVER (coalesce, replace): the end of the run that holds the lock, in one
-- step: the lock goes to the pending follow-up if there is one, else it is released as
-- RELEASE does. A call that becomes the follow-up either comes before this step (and is
-- handed the lock) or after it (and finds the lock free): none is left behind.
-- The handed call is kept a while in <base>${K_HANDED} under the ending owner token, so a
-- retry whose first reply was lost (a timeout while the server was stalled) gets it again
-- rather than finding the key no longer its own. With no owner token (ARGV[1] empty: the
-- worker sweep) or one that no longer owns the lock, a follow-up left behind beside a free
-- lock (its holder died, or its release failed and the lease ran out) is handed the lock.
-- KEYS[1] lock key, KEYS[2] waiters' queue <base>${K_QUEUE}, KEYS[3] pending follow-up
-- <base>${K_PENDING}, KEYS[4] handed follow-up <base>${K_HANDED}, KEYS[5] (optional) the
-- done set <base>${K_DONE}, where the run's task id is recorded as finished
-- ARGV[1] owner token of the run that ends ('' for none), ARGV[2] the follow-up's queue
-- lease (ms), ARGV[3] how long the handed call is kept (ms), ARGV[4] the fencing token of
-- the hold that ends (a retry is recognised by owner and fencing token), ARGV[5], ARGV[6]
-- (with KEYS[5]; '' and 0 without it when ARGV[7] follows) the task id to record in KEYS[5]
-- and how long it is kept (ms), ARGV[7] (optional) '1': the lock has stacked limits: the
-- ending run's shares are given back (lib/stack.lua)
-- returns {0, pending}: not owned and nothing left behind to hand over (pending: 1 while a
--            follow-up waits for a holder that still holds the key)
--         {1, task id, arguments, content type, encoding, options}: the lock now belongs to
--            the follow-up's queue token; publish it
--         {2, RELEASE's reply}: no follow-up: released
--         {3, task id, ...}: as 1, for a follow-up left behind beside a free lock
--@include release
--@include write
--@include held
local function hand(p, fence, code)
  redis.call('DEL', KEYS[3], KEYS[4])  -- first: a write that never needs memory
  redis.call('HSET', KEYS[4], 'id', p[1], 'body', p[4], 'ctype', p[5], 'encoding', p[6],
    'options', p[7], 'by', ARGV[1] .. ':' .. ARGV[4])
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3]))
  local now, now_us = clock()
  write(KEYS[1], p[2], math.max(now_us, fence + 1), p[3], now, tonumber(ARGV[2]))
  if KEYS[5] then finished(KEYS[5], ARGV[5], ARGV[6]) end
  return {code, p[1], p[4], p[5], p[6], p[7]}
end
local function pending_call(key)
  return redis.call('HMGET', key, 'id', 'token', 'info', 'body', 'ctype', 'encoding',
    'options')
end
local current = redis.call('GET', KEYS[1])
local flag, fence = nil, nil
if current and ARGV[1] ~= '' then flag, fence = owned(current, ARGV[1]) end
if flag then
  if ARGV[7] == '1' then stack_drop(base(KEYS[1]), ARGV[1]) end
  local p = pending_call(KEYS[3])
  if not p[1] then
    return {2, release(KEYS[1], KEYS[2], ARGV[1], '1', KEYS[5], ARGV[5], ARGV[6])}
  end
  return hand(p, tonumber(fence), 1)
end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[4], 'by') == ARGV[1] .. ':' .. ARGV[4] then
  local p = redis.call('HMGET', KEYS[4], 'id', 'body', 'ctype', 'encoding', 'options')
  return {1, p[1], p[2], p[3], p[4], p[5]}
end
local p = pending_call(KEYS[3])
if not p[1] then return {0, 0} end
local now = clock()
if held(KEYS[1], now) then return {0, 1} end
local old = 0
if current then
  local _, _, text = fields(current)
  if not text then return {0, 1} end  -- a foreign value: the next call of the key decides
  old = tonumber(text)
end
return hand(p, old, 3)

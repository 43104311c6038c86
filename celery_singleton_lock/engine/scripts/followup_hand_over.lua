-- FOLLOWUP_HAND_OVER (coalesce, replace): the end of the run that holds the lock, in one
-- step: the lock goes to the pending follow-up if there is one, else it is released as
-- RELEASE does. A call that becomes the follow-up either comes before this step (and is
-- handed the lock) or after it (and finds the lock free): none is left behind.
-- KEYS[1] lock key, KEYS[2] waiters' queue <base>${K_QUEUE}, KEYS[3] pending follow-up
-- <base>${K_PENDING}, KEYS[4] (optional) the done set
-- <base>${K_DONE}, where the run's task id is recorded as finished
-- ARGV[1] owner token of the run that ends, ARGV[2] the follow-up's queue lease (ms),
-- ARGV[3] the task id to record in KEYS[4], ARGV[4] how long it is kept (ms)
-- returns {0}: not owned (nothing done)
--         {1, task id, arguments, content type, encoding, options}: the lock now belongs to
--            the follow-up's queue token; publish it
--         {2, RELEASE's reply}: no follow-up: released
--@include release
--@include write
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
local flag, fence = owned(current, ARGV[1])
if not flag then return {0} end
local p = redis.call('HMGET', KEYS[3], 'id', 'token', 'info', 'body', 'ctype', 'encoding',
  'options')
if not p[1] then
  return {2, release(KEYS[1], KEYS[2], ARGV[1], '1', KEYS[4], ARGV[3], ARGV[4])}
end
redis.call('DEL', KEYS[3])  -- first: a write that never needs memory
local now, now_us = clock()
write(KEYS[1], p[2], math.max(now_us, tonumber(fence) + 1), p[3], now, tonumber(ARGV[2]))
if KEYS[4] then finished(KEYS[4], ARGV[3], ARGV[4]) end
return {1, p[1], p[4], p[5], p[6], p[7]}

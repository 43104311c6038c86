-- FOLLOWUP_HAND_OVER: at the end of the run that holds the lock, give it to the pending
-- follow-up.
-- KEYS[1] lock key, KEYS[2] pending follow-up <base>${K_PENDING}, KEYS[3] (optional) where
-- to record who finished
-- ARGV[1] owner token of the run that ends, ARGV[2] the follow-up's queue lease (ms),
-- ARGV[3] the value to record in KEYS[3], ARGV[4] its TTL ms
-- returns {0}: not owned, or no follow-up (release as usual)
--         {1, task id, arguments, content type, encoding, options}: the lock now belongs to
--            the follow-up's queue token; publish it
--@include clock
--@include owner
--@include write
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
local flag, fence = owned(current, ARGV[1])
if not flag then return {0} end
local p = redis.call('HMGET', KEYS[2], 'id', 'token', 'info', 'body', 'ctype', 'encoding',
  'options')
if not p[1] then return {0} end
redis.call('DEL', KEYS[2])  -- first: a write that never needs memory
local now, now_us = clock()
write(KEYS[1], p[2], math.max(now_us, tonumber(fence) + 1), p[3], now, tonumber(ARGV[2]))
if KEYS[3] then redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[4])) end
return {1, p[1], p[4], p[5], p[6], p[7]}

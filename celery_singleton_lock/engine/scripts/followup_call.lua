-- FOLLOWUP_CALL (lock_on_conflict="coalesce"): one call made while the key may be held.
-- KEYS[1] lock key, KEYS[2] pending follow-up (hash) <base>${K_PENDING}
-- ARGV[1] this call's task id, ARGV[2] its queue owner token, ARGV[3] its holder info,
-- ARGV[4] serialized arguments, ARGV[5] content type, ARGV[6] content encoding,
-- ARGV[7] kept publish options (JSON), ARGV[8] how long a follow-up is kept (ms)
-- returns {1, task id}: the lock is held; this call is (now) its follow-up: publish nothing
--         {2, task id, token, info}: the lock is free but a follow-up was left behind (its
--            holder ended without handing over): take the lock for that task id and publish
--            this call under it
--         {0}: the lock is free: take it as usual
--@include clock
--@include pending
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

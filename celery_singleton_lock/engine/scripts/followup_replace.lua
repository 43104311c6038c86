-- FOLLOWUP_REPLACE (lock_on_conflict="replace"): one call made while the key may be held.
-- KEYS[1] lock key, KEYS[2] pending follow-up <base>${K_PENDING}
-- ARGV[1..8] as FOLLOWUP_CALL, ARGV[9] '1' to supersede a running holder too (it is to be
-- revoked), ARGV[10] the queue lease (ms) of this call's lock
-- returns {0}: the lock is free: take it as usual
--         {1, superseded task id}: the holder was still queued: the lock is this call's now
--            (a new fencing token); publish it; the superseded message will not run
--         {2, task id}: the holder runs: this call is (now) its follow-up
--         {3, superseded task id}: the holder runs and ARGV[9] is '1': this call is (now)
--            its follow-up, which gets the key once the holder's run has really stopped;
--            revoke the holder (terminate). The key is not taken from a running holder:
--            a run that a terminate fails to stop (a second delivery of it, another pool)
--            must not overlap the new call.
-- A superseded task id is marked in <base>${K_SUPERSEDED}<task id> (value: ARGV[1]).
--@include clock
--@include pending
--@include write
--@include base
local now, now_us = clock()
local is_held, current = held(KEYS[1], now)
if not is_held then return {0} end
local _, token, fence, info = fields(current)
local ok, holder = pcall(cjson.decode, info or '')
if not token or not ok or type(holder) ~= 'table' or not holder.task_id then
  return {2, pend(KEYS[2], ARGV, 1)}  -- a holder we cannot supersede: follow it
end
if holder.queued ~= true then
  return {ARGV[9] == '1' and 3 or 2, pend(KEYS[2], ARGV, 1), holder.task_id}
end
write(KEYS[1], ARGV[2], math.max(now_us, tonumber(fence) + 1), ARGV[3], now, tonumber(ARGV[10]))
-- kept as long as a follow-up (ARGV[8]), so a message that comes late still finds it
redis.call('SET', base(KEYS[1]) .. '${K_SUPERSEDED}' .. holder.task_id, ARGV[1], 'PX',
  tonumber(ARGV[8]))
redis.call('DEL', KEYS[2])
return {1, holder.task_id}

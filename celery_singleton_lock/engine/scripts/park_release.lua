-- PARK_RELEASE (lock_on_conflict="park"): the end of the run that holds the key, in one
-- step: the key goes to the first parked call if there is one (the releasing process
-- publishes it), else it is released as RELEASE does.
-- KEYS[1] lock key (or the slot the run holds), KEYS[2] waiters' queue <base>${K_QUEUE},
-- KEYS[3] (optional) the done set <base>${K_DONE}, where the run's task id is recorded as
-- finished
-- ARGV[1] owner token of the run that ends, ARGV[2] the lease of a grant (ms), ARGV[3] the
-- number of slots, ARGV[4] the task id to record in KEYS[3], ARGV[5] how long it is kept,
-- ARGV[6] the task id of the run that ends when the key's calls run in order
-- (lock_order="enqueue": it leaves the line, in the same step), else '', ARGV[7] (optional)
-- '1': the lock has stacked limits: the ending run's shares are given back (lib/stack.lua)
-- returns {0}: not owned (nothing done)
--         {1, task id, payload}: the key now holds the first parked call's grant: publish it
--         {2, RELEASE's reply}: nobody parked: released
--@include release
--@include park
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
if not owned(current, ARGV[1]) then return {0} end
local b = base_of(KEYS[2], '${K_QUEUE}')
if ARGV[7] == '1' then stack_drop(b, ARGV[1]) end
local slots = tonumber(ARGV[3])
local ordered = ARGV[6] ~= nil and ARGV[6] ~= ''
if ordered then
  redis.call('ZREM', b .. '${K_ORDER}', ARGV[6])
  redis.call('ZREM', b .. '${K_ORDER_DUE}', ARGV[6])
end
if redis.call('ZCARD', b .. '${K_PARKED}') == 0 then
  return {2, release(KEYS[1], KEYS[2], ARGV[1], ARGV[3], KEYS[3], ARGV[4], ARGV[5])}
end
if KEYS[3] then finished(KEYS[3], ARGV[4], ARGV[5]) end
local head, payload = grant(KEYS[1], b, current, tonumber(ARGV[2]), slots, ordered)
if not head then  -- every parked entry had lapsed
  return {2, release(KEYS[1], KEYS[2], ARGV[1], ARGV[3], nil, nil, nil)}
end
return {1, head, payload}

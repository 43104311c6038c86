-- PARK (lock_on_conflict="park"): a call whose key is held joins the key's park queue, in
-- the same step that finds the key held. A free key with calls parked before this one is
-- handed to the first of them (no newcomer barges past the queue).
-- KEYS[1] lock key, KEYS[2] the park queue <base>${K_PARKED}, KEYS[3] the parked calls
-- <base>${K_PARKDATA}
-- ARGV[1] task id, ARGV[2] its turn (score; '' for its arrival: server microseconds),
-- ARGV[3] the call ("<grant token>\n<grant holder info>\n<payload>"), ARGV[4] how long the
-- queue is kept (ms), ARGV[5] the lease of a grant (ms), ARGV[6] the number of slots,
-- ARGV[7] '1' when the key's calls run in the order they were made (lock_order="enqueue"):
-- then a call whose turn has not come parks even on a free key
-- returns {1, position}: parked (1 is the next to get the key)
--         {2, position, task id, payload}: parked; the key was free and the first parked
--            call holds it now: publish that call
--         {0}: the key is free and nobody is parked before this call: take it as usual
--@include park
local now, now_us = clock()
local b = base(KEYS[1])
local slots = tonumber(ARGV[6])
local ordered = ARGV[7] == '1'
local free, current = free_slot(KEYS[1], b, now, slots)
local score = ARGV[2] ~= '' and ARGV[2] or now_us
if free and in_turn(b, ARGV[1], slots, ordered) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if not first[1] or first[1] == ARGV[1] or tonumber(first[2]) > tonumber(score) then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('HDEL', KEYS[3], ARGV[1])
    return {0}
  end
end
redis.call('ZADD', KEYS[2], 'NX', score, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
if ordered then  -- a parked call keeps its place in the line while it waits
  redis.call('ZADD', b .. '${K_ORDER_DUE}', 'XX', now + tonumber(ARGV[4]), ARGV[1])
end
if free then
  local head, payload = grant(free, b, current, tonumber(ARGV[5]), slots, ordered)
  if head then
    return {2, redis.call('ZRANK', KEYS[2], ARGV[1]) + 1, head, payload}
  end
end
return {1, redis.call('ZRANK', KEYS[2], ARGV[1]) + 1}

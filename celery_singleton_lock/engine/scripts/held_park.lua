-- HELD_PARK: a call that a stacked limit or its rate holds back is kept in the lock Redis
-- (lib/holdback.lua) until it fits, holding no worker: held back by a limit, in the same step
-- that finds it still does not fit (it then keeps its place in the line of every limit it
-- does not fit in, as STACK_LINE does); held back by its rate, until its window opens.
-- KEYS[1] <sb>${S_HELD}, KEYS[2] <sb>${S_HELD_CALLS}, KEYS[3] <sb>${S_HELD_OUT},
-- KEYS[4] <sb>${S_HELD_WAKE} (sb: the application's stack base)
-- ARGV[1] task id, ARGV[2] ms from now until it is due (0: held back by a limit), ARGV[3]
-- its lock key, ARGV[4] the call (opaque), ARGV[5] how long the held calls are kept (ms),
-- ARGV[6] the stack spec ('' none: only its window holds it back), ARGV[7] the place token
-- it claims with, ARGV[8] how long its places in the lines are kept (ms), ARGV[9] '1': wake
-- a worker's sweep (its due time may come before the one a sweep waits for)
-- returns {1, the first limit it does not fit in, or ''}: held back
--         {0}: it fits now, or its weight is above a limit's number, so it never will
--         (nothing is kept: try again at once; that acquire refuses it for good)
--@include clock
--@include stack
local now, now_us = clock()
local spec = stack_spec(ARGV[6])
local limit = ''
if spec then
  local blocked = stack_blocked(spec, ARGV[7], now, now_us, tonumber(ARGV[8]), ARGV[7])
  if not blocked then return {0} end
  limit = blocked
end
local keep = tonumber(ARGV[5])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[6] .. '\n' .. ARGV[7] .. '\n' .. ARGV[3] .. '\n' .. ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[1])
for _, key in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
end
if ARGV[9] == '1' then
  redis.call('RPUSH', KEYS[4], '1')
  redis.call('PEXPIRE', KEYS[4], ${HELD_WAKE_TTL_MS})
end
return {1, limit}

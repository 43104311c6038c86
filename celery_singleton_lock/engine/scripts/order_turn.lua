-- ORDER_TURN (lock_order="enqueue"): at delivery, whether a call's turn has come.
-- KEYS[1] lock key, KEYS[2] the key's done set <base>${K_DONE}
-- ARGV[1] task id, ARGV[2] its turn (from its message), ARGV[3] the number of slots,
-- ARGV[4] how long a call that parks keeps its place (ms), ARGV[5] how long a call that
-- goes ahead keeps its place without finishing (ms: its lease, so that a run whose worker
-- died stops holding up the line when its hold would have run out)
-- returns 1: its turn has come (it is one of the first N outstanding calls); 0: a call
--         before it is outstanding (it parks); -1: it finished already (a late copy)
--@include clock
--@include base
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return -1 end
local b = base(KEYS[1])
local line, due = b .. '${K_ORDER}', b .. '${K_ORDER_DUE}'
local now = clock()
-- calls whose place ran out (their message never came, their run died) leave the line
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 20)) do
  redis.call('ZREM', line, id)
  redis.call('ZREM', due, id)
end
-- a call no longer in the line (its place ran out, a restart lost it) is back at its turn
redis.call('ZADD', line, 'NX', ARGV[2], ARGV[1])
local keep = tonumber(ARGV[4])
local ahead = redis.call('ZRANK', line, ARGV[1]) < tonumber(ARGV[3])
redis.call('ZADD', due, now + (ahead and tonumber(ARGV[5]) or keep), ARGV[1])
redis.call('PEXPIRE', line, keep)
redis.call('PEXPIRE', due, keep)
return ahead and 1 or 0

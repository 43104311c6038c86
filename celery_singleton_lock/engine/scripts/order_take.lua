-- ORDER_TAKE (lock_order="enqueue"): a call takes its turn in the line of its key: the next
-- number of the key's counter, behind every call of a lower rank (a call already in the
-- line keeps its turn).
-- KEYS[1] lock key
-- ARGV[1] task id, ARGV[2] its rank (0-255, 0 first: its priority), ARGV[3] how long it may stay
-- in the line (ms) before it is taken for lost
-- returns its turn (a number: lower goes first)
--@include clock
--@include base
local b = base(KEYS[1])
local line, due, seq = b .. '${K_ORDER}', b .. '${K_ORDER_DUE}', b .. '${K_SEQ}'
local now = clock()
local keep = tonumber(ARGV[3])
local turn = redis.call('ZSCORE', line, ARGV[1])
if not turn then
  turn = tonumber(ARGV[2]) * 68719476736 + redis.call('INCR', seq)
  redis.call('ZADD', line, turn, ARGV[1])
  redis.call('ZADD', due, now + keep, ARGV[1])
end
redis.call('PEXPIRE', seq, keep)
redis.call('PEXPIRE', line, keep)
redis.call('PEXPIRE', due, keep)
return string.format('%.0f', turn)

-- ORDER_LEAVE (lock_order="enqueue"): a call leaves the line of its key without running
-- (revoked, dropped), so the calls behind it do not wait for it.
-- KEYS[1] lock key
-- ARGV[1] task id
-- returns 1 when it was in the line, else 0
--@include base
local b = base(KEYS[1])
redis.call('ZREM', b .. '${K_ORDER_DUE}', ARGV[1])
return redis.call('ZREM', b .. '${K_ORDER}', ARGV[1])

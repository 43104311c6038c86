-- PARK_STARTED: a call handed the key from the park queue starts its run: it is no longer
-- the sweep's to publish again. A copy of a call recorded as finished (another copy of the
-- same message took the grant and ran first) is told so, in the same step.
-- KEYS[1] lock key, KEYS[2] the key's done set <base>${K_DONE}
-- ARGV[1] its task id
-- returns 1 when it was a handed-off call, 0 when not, -1 when it finished already
--@include base
local b = base(KEYS[1])
redis.call('HDEL', b .. '${K_PARKDATA}', ARGV[1])
local handed = redis.call('ZREM', b .. '${K_GRANTED}', ARGV[1])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return -1 end
return handed

-- PARK_STARTED: a call handed the key from the park queue started its run: it is no
-- longer the sweep's to publish again.
-- KEYS[1] lock key
-- ARGV[1] its task id
-- returns 1 when it was a handed-off call, else 0
--@include base
local b = base(KEYS[1])
redis.call('HDEL', b .. '${K_PARKDATA}', ARGV[1])
return redis.call('ZREM', b .. '${K_GRANTED}', ARGV[1])

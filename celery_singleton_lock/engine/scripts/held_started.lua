-- HELD_STARTED: a call that was held back in the lock Redis (lib/holdback.lua) starts its run
-- (or, a late copy of a call that ran, ends without running, or it waits elsewhere now):
-- it is no longer the sweep's to hand out, and its places in the limits' lines go (a run
-- that took its shares took them up already).
-- KEYS[1] <sb>${S_HELD}, KEYS[2] <sb>${S_HELD_CALLS}, KEYS[3] <sb>${S_HELD_OUT}
-- ARGV[1] its task id
-- returns 1 when it was held or handed out, else 0
--@include clock
--@include stack
local entry = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if not entry then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
local text, place = held_entry(entry)
local ok, spec = pcall(stack_spec, text)
if ok and spec then held_places(spec, place, 0, nil) end
return 1

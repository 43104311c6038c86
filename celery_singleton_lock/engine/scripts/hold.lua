-- HOLD (lock_release="success"): the owner's hold becomes a hold of ARGV[2] ms that nobody
-- renews: same owner token, same fencing token, the waiters' flag kept (they take it over
-- when it ends).
-- KEYS[1] lock key (or the slot held), KEYS[2] (optional) the done set <base>${K_DONE}
-- ARGV[1] owner token, ARGV[2] hold ms (from server now), ARGV[3] holder info to keep,
-- ARGV[4], ARGV[5] (with KEYS[2]) the task id to record as finished, and how long it is
-- kept (ms)
-- returns the end of the hold (server ms), or 0 when not owned (nothing done)
-- When KEYS[1] is a slot of a lock with slots (the lock key is its slot 1), the slot index
-- follows (lib/slots.lua; for a lock without slots there is no index: nothing is written).
--@include clock
--@include lease
--@include owner
--@include finished
--@include slots
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, fence = owned(current, ARGV[1])
if not flag then return 0 end
local hold = tonumber(ARGV[2])
local now = clock()
local expiry = now + hold
local ttl = key_ttl(hold)
-- PEXPIRE first: a write that never needs memory (see engine/scripts/__init__.py)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[1], format_value(expiry, flag, ARGV[1], fence, ARGV[3]), 'PX', ttl)
index_extended(KEYS[1], expiry, ttl)
if KEYS[2] then finished(KEYS[2], ARGV[4], ARGV[5]) end
return expiry

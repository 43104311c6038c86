-- EXTEND: owner-checked new lease end, from the server's now.
-- KEYS[1] lock key (or the slot held)
-- ARGV[1] owner token, ARGV[2] new lease ms (from server now), ARGV[3] (optional, any
-- value) the lock has slots: the slot index follows (lib/slots.lua: only an index that
-- exists is written, so it is harmless on a lock without slots), ARGV[4] (optional) '1': the
-- lock has stacked limits (lib/stack.lua)
-- A hold with stacked limits (lib/stack.lua) renews its share of each with its lease; one
-- whose share lapsed and no longer fits has lost its place: 0, as for a lost key.
-- returns the new expiry ms, or 0 when not owned (nothing done)
--@include clock
--@include lease
--@include owner
--@include slots
--@include stack
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, fence, info = owned(current, ARGV[1])
if not flag then return 0 end
local lease = tonumber(ARGV[2])
local now = clock()
local expiry = now + lease
local ttl = key_ttl(lease)
-- PEXPIRE first: a write that never needs memory. Once a script has written, Redis lets its
-- later writes through even at maxmemory, so a holder can renew while the server refuses
-- writes that grow memory (the same value length: the SET does not grow it).
redis.call('PEXPIRE', KEYS[1], ttl)
if ARGV[4] == '1' and not stack_extend(slot_of(KEYS[1]), ARGV[1], expiry, ttl, now) then
  return 0
end
redis.call('SET', KEYS[1], format_value(expiry, flag, ARGV[1], fence, info), 'PX', ttl)
if ARGV[3] then index_extended(KEYS[1], expiry, ttl) end
return expiry

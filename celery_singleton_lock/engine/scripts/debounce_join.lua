-- DEBOUNCE_JOIN (lock_debounce): add one call to the open burst of a key, or open one.
-- KEYS[1] the key's open burst <base>${K_DEBOUNCE} (hash: id, gen, first, due), KEYS[2] the
-- key's done set <base>${K_DONE}
-- ARGV[1] this call's task id, ARGV[2] the quiet time T (ms), ARGV[3] the longest a burst
-- may be put off after its first call M (ms; 0: no limit), ARGV[4] how long past its due
-- time a burst's records are kept (ms)
-- returns {burst task id, generation of this call, ms until the burst's run is due}
-- A burst is open while its due time is ahead and it has not run. Each burst keeps its
-- latest generation in <base>${K_BURST}<burst task id>, so a burst whose run a busy worker
-- delays still runs (with its last call) after a later call opened the next burst.
--@include clock
--@include base
local now = clock()
local burst = redis.call('HMGET', KEYS[1], 'id', 'gen', 'first', 'due')
local id, gen, first = ARGV[1], 1, now
if burst[1] and tonumber(burst[4]) > now and not redis.call('ZSCORE', KEYS[2], burst[1]) then
  id, gen, first = burst[1], tonumber(burst[2]) + 1, tonumber(burst[3])
end
local due = now + tonumber(ARGV[2])
if tonumber(ARGV[3]) > 0 then due = math.min(due, first + tonumber(ARGV[3])) end
local keep = due - now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'id', id, 'gen', gen, 'first', first, 'due', due)
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('SET', base_of(KEYS[1], '${K_DEBOUNCE}') .. '${K_BURST}' .. id, gen, 'PX', keep)
return {id, gen, due - now}

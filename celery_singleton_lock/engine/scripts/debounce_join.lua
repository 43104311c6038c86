-- DEBOUNCE_JOIN (lock_debounce): add one call to the open burst of a key, or open one.
-- KEYS[1] the burst record <base>${K_DEBOUNCE} (hash: id, gen, first, due, ran)
-- ARGV[1] this call's task id, ARGV[2] the quiet time T (ms), ARGV[3] the longest a burst
-- may be put off after its first call M (ms; 0: no limit), ARGV[4] how long past its due
-- time the record is kept (ms)
-- returns {burst task id, generation of this call, ms until the burst's run is due}
--@include clock
local now = clock()
local burst = redis.call('HMGET', KEYS[1], 'id', 'gen', 'first', 'due', 'ran')
local id, gen, first = ARGV[1], 1, now
if burst[1] and burst[5] ~= '1' and tonumber(burst[4]) > now then
  id, gen, first = burst[1], tonumber(burst[2]) + 1, tonumber(burst[3])
end
local due = now + tonumber(ARGV[2])
if tonumber(ARGV[3]) > 0 then due = math.min(due, first + tonumber(ARGV[3])) end
redis.call('HSET', KEYS[1], 'id', id, 'gen', gen, 'first', first, 'due', due, 'ran', '0')
redis.call('PEXPIRE', KEYS[1], due - now + tonumber(ARGV[4]))
return {id, gen, due - now}

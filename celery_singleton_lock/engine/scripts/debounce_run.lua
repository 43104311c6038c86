-- DEBOUNCE_RUN: at delivery, whether this message is its burst's latest call.
-- KEYS[1] the burst record <base>${K_DEBOUNCE}
-- ARGV[1] the delivered message's task id, ARGV[2] its generation
-- returns 1 when it is the burst's latest call, delivered for the first time (the burst is
-- closed: it runs; a call made from now on opens a new burst), else 0
local burst = redis.call('HMGET', KEYS[1], 'id', 'gen', 'ran')
if not burst[1] then return 1 end  -- no record left (a restart): run rather than lose it
if burst[1] ~= ARGV[1] or burst[2] ~= ARGV[2] or burst[3] == '1' then return 0 end
redis.call('HSET', KEYS[1], 'ran', '1')
return 1

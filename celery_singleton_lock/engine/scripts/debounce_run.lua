-- DEBOUNCE_RUN: at delivery, whether this message is its burst's latest call, still to run.
-- KEYS[1] the burst's latest generation <base>${K_BURST}<burst task id>, KEYS[2] the key's
-- done set <base>${K_DONE}
-- ARGV[1] the burst's task id, ARGV[2] the delivered message's generation, ARGV[3] how long a
-- recreated record is kept (ms)
-- returns 1 when it is the burst's latest call and the burst has not finished (a retry or a
-- redelivery of that message runs too: only a finished run closes the burst), else 0.
-- With the record lost (a restart of the lock Redis), the first message delivered wins: it
-- runs and becomes the burst's latest call, and the burst's other messages do not run.
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local latest = redis.call('GET', KEYS[1])
if not latest then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
  return 1
end
if latest == ARGV[2] then return 1 end
return 0

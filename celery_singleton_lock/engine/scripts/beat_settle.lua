-- BEAT_SETTLE: what became of a slot a beat leader claimed (BEAT_CLAIM): sent, or given
-- back because its publish failed (the slot may then be taken again).
-- KEYS[1] slot records <base>${K_BEAT_SLOTS}
-- ARGV[1] the entry's name, ARGV[2] the slot (ms, as claimed), ARGV[3] the claimer's
-- fencing token, ARGV[4] 's' sent, 'u' given back
-- Only that very claim is settled: a record that moved on (another slot, another claimer)
-- is left alone. It needs no lease: it records what the claimer did.
-- returns 1 settled, 0 the record is no longer that claim (nothing done)
--@include clock
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return 0 end
local slot, state, fence, at, before = string.match(record, '^(%d+):(%a):(%d+):(%d+):(%d*)$')
if slot ~= ARGV[2] or state ~= 'c' or fence ~= ARGV[3] then return 0 end
if ARGV[4] == 's' then
  redis.call('HSET', KEYS[1], ARGV[1], slot .. ':s:' .. fence .. ':' .. at .. ':' .. before)
else
  local now = clock()
  redis.call('HSET', KEYS[1], ARGV[1],
    slot .. ':u:' .. fence .. ':' .. string.format('%.0f', now) .. ':' .. before)
end
return 1

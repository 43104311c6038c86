-- BEAT_CLAIM: a beat leader takes one slot of a schedule entry (to send it, or to skip it
-- by the catch-up rule), in one step with the check that it still leads.
-- KEYS[1] the group's leader lease (a RedisLock key), KEYS[2] its slot records
-- <base>${K_BEAT_SLOTS} (a hash: entry name -> record)
-- ARGV[1] the leader's owner token, ARGV[2] its fencing token, ARGV[3] the entry's name,
-- ARGV[4] the slot (its scheduled time, Unix ms), ARGV[5] 'c' to send it (claimed until
-- settled by BEAT_SETTLE) or 'k' to skip it, ARGV[6] how long the records are kept (ms)
-- A record is '<slot ms>:<state>:<fencing token>:<server ms>:<previous slot ms>'; state c
-- claimed, s sent, k skipped, u given back (its publish failed: the slot is free again and
-- the previous one is the last taken).
-- returns {1, server ms} taken;
--         {0, record} the entry already took this slot or a later one (nothing done);
--         {-1, server ms} the caller does not lead: the lease is someone else's, gone or
--         over, or the fencing token is not the lease's (nothing done)
--@include clock
--@include value
local now = clock()
local current = redis.call('GET', KEYS[1])
if not current then return {-1, now} end
local held_until, _, fence, owner = parse(current)
if owner ~= ARGV[1] or held_until == nil or held_until <= now or fence ~= tonumber(ARGV[2]) then
  return {-1, now}
end
local slot = tonumber(ARGV[4])
local last = ''
local record = redis.call('HGET', KEYS[2], ARGV[3])
if record then
  local taken, state, _, _, before = string.match(record, '^(%d+):(%a):(%d*):(%d*):(%d*)$')
  if taken then
    if state == 'u' then
      if slot < tonumber(taken) then return {0, record} end
      last = before
    else
      if slot <= tonumber(taken) then return {0, record} end
      last = taken
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3],
  ARGV[4] .. ':' .. ARGV[5] .. ':' .. ARGV[2] .. ':' .. string.format('%.0f', now) .. ':' .. last)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return {1, now}

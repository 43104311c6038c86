-- BEAT_PRESENCE: a replica of a beat group says it is alive (its heartbeat, or that it
-- leaves), and reads the slot records the group's leaders wrote.
-- KEYS[1] replicas <base>${K_BEAT_REPLICAS} (a hash: replica id -> '<until ms>:<info>'),
-- KEYS[2] slot records <base>${K_BEAT_SLOTS}
-- ARGV[1] replica id, ARGV[2] its info (a JSON text), ARGV[3] how long the heartbeat
-- counts (ms), ARGV[4] how long the slot records are kept (ms), ARGV[5] '1': the replica
-- leaves (its heartbeat is removed), else '0'
-- Heartbeats that ran out are removed here, so the hash holds only replicas seen lately;
-- both hashes expire when no replica is left to refresh them.
-- returns {server ms, the slot records as HGETALL gives them}
--@include clock
local now = clock()
local keep = tonumber(ARGV[3])
if ARGV[5] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + keep) .. ':' .. ARGV[2])
end
local seen = redis.call('HGETALL', KEYS[1])
for i = 1, #seen, 2 do
  local ends = tonumber(string.match(seen[i + 1], '^(%d+):') or '0')
  if ends <= now then redis.call('HDEL', KEYS[1], seen[i]) end
end
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {now, redis.call('HGETALL', KEYS[2])}

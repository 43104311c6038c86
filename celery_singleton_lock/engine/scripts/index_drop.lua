-- INDEX_DROP: a key leaves the park sweep's list (a sorted set of "task\nkey" members
-- scored by the server second they were last named), unless it was named again lately.
-- KEYS[1] the list
-- ARGV[1] the member, ARGV[2] the second before which it may go
-- returns 1 when it was removed, else 0
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) < tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0

--@include clock
-- finished(done key, task id, keep ms): record in the same step that this task id's run of
-- the key finished: a member of the sorted set <base>${K_DONE}, scored with the server time
-- in ms. Members older than keep ms are pruned on every write, and the set itself vanishes
-- keep ms after its last write, so it holds only the runs a late duplicate delivery could
-- still repeat.
local function finished(key, task_id, keep)
  local now = clock()
  keep = tonumber(keep)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - keep)
  redis.call('ZADD', key, now, task_id)
  redis.call('PEXPIRE', key, keep)
end

--@include value
--@include lease
-- write(lock key, owner token, fencing token, holder info, now ms, lease ms): the lock, no
-- waiters flagged, for that owner until now + lease
local function write(key, token, fence, info, now, lease)
  redis.call('SET', key, format_value(now + lease, '0', token, fence, info), 'PX', key_ttl(lease))
end

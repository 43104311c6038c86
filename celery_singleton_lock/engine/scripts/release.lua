-- RELEASE: owner-checked release; hands the lock straight to the first live waiter, else
-- wakes the waiters.
-- KEYS[1] lock key (or, with slots, the slot this holder releases), KEYS[2] waiters' queue
-- <base>${K_QUEUE}, KEYS[3] (optional) a key that records who finished last
-- ARGV[1] owner token, ARGV[2] the number of slots (1: a plain lock; more: the highest
-- token issued across slots is kept in <base>${K_FENCE}), ARGV[3] the value to record in
-- KEYS[3], ARGV[4] its TTL ms
-- returns 0 not owned (nothing done), 1 released, 2 released and waiters signalled,
--         3 handed over to the first live waiter
--@include clock
--@include lease
--@include owner
--@include base
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local flag, fence = owned(current, ARGV[1])
if not flag then return 0 end
local function finished()
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[3], 'PX', tonumber(ARGV[4]))
  end
end
if flag == '0' then
  redis.call('DEL', KEYS[1])
  finished()
  return 1
end
-- KEYS[1] may be a slot: the companions' base comes from the queue key
local b = base_of(KEYS[2], '${K_QUEUE}')
-- ZPOPMIN comes first: a write that never needs memory (see engine/scripts/__init__.py)
for _ = 1, 16 do
  local waiter = redis.call('ZPOPMIN', KEYS[2])[1]
  if not waiter then break end
  local wants = redis.call('GET', b .. '${K_WAITER}' .. waiter)
  if wants then
    local lease, info = string.match(wants, '^(%d+):(.*)$')
    lease = tonumber(lease)
    local now, now_us = clock()
    local next_fence = math.max(now_us, tonumber(fence) + 1)
    local ttl = key_ttl(lease)
    if ARGV[2] ~= '1' then
      next_fence = math.max(next_fence, tonumber(redis.call('GET', b .. '${K_FENCE}') or 0) + 1)
      redis.call('SET', b .. '${K_FENCE}', string.format('%.0f', next_fence), 'PX', ttl)
    end
    local expiry = string.format('%.0f', now + lease)
    next_fence = string.format('%.0f', next_fence)
    local more = redis.call('ZCARD', KEYS[2]) > 0 and '1' or '0'
    redis.call('SET', KEYS[1], format_value(expiry, more, waiter, next_fence, info), 'PX', ttl)
    local grant = b .. '${K_GRANT}' .. waiter
    redis.call('RPUSH', grant, next_fence .. ':' .. expiry .. ':' .. KEYS[1])
    redis.call('PEXPIRE', grant, ${GRANT_TTL_MS})
    finished()
    return 3
  end
end
redis.call('DEL', KEYS[1])  -- first: a write that never needs memory
finished()
redis.call('RPUSH', b .. '${K_SIGNAL}', '1')
redis.call('PEXPIRE', b .. '${K_SIGNAL}', ${SIGNAL_TTL_MS})
return 2

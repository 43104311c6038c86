--@include clock
--@include lease
--@include owner
--@include base
--@include finished
--@include slots
--@include stack
-- release(lock or slot key, waiters' queue key, owner token, slots, done key, task id,
-- keep ms, fair ms, stack) -> 0 not owned (nothing done), 1 released, 2 released and waiters
-- signalled, 3 handed over to the first live waiter. With fair ms > 0 (eventual fairness,
-- fair_after) the lock is handed over only once the first waiter has waited that long
-- (since its first try); before that it is freed and the waiters woken, so a newcomer may
-- take it first. Owner-checked; with slots > 1 the highest token
-- issued across slots is kept in <base>${K_FENCE}, the slot index follows (lib/slots.lua),
-- and any waiter is served whatever the flag (ACQUIRE_SLOTS flags no slot: that would
-- mean writing all N). With a done key (optional), the task id is recorded as finished in
-- the same step (lib/finished.lua). With stack (a hold of a lock with stacked limits,
-- lib/stack.lua) its shares are given back here too; a lock without never reads their
-- record (a least-privilege user of an older version may not be allowed to).
local function release(key, queue, token, slots, done_key, task_id, keep, fair, stack)
  local current = redis.call('GET', key)
  if not current then return 0 end
  local flag, fence = owned(current, token)
  if not flag then return 0 end
  local function done()
    if done_key then finished(done_key, task_id, keep) end
  end
  -- key may be a slot: the companions' base comes from the queue key
  local b = base_of(queue, '${K_QUEUE}')
  -- A hold with stacked limits gives its shares back, and never hands the key straight
  -- to a waiter (that waiter's own weight may not fit): the key is freed and they are woken.
  local stacked = stack and stack_drop(b, token)
  local slot = nil
  if slots ~= '1' then
    local of, number = slot_of(key)
    slot = of == b and number or 1  -- else key is this lock's own (a name like a slot's)
  end
  if flag == '0' and (not slot or redis.call('ZCARD', queue) == 0) then
    redis.call('DEL', key)  -- first: a write that never needs memory
    if slot then index_free(b, slot) end
    done()
    return 1
  end
  local barge = stacked
  if fair and fair > 0 then
    local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if head[1] then
      local _, now_us = clock()
      barge = now_us - tonumber(head[2]) < fair * 1000
    end
  end
  -- ZPOPMIN comes first: a write that never needs memory (see engine/scripts/__init__.py)
  for _ = 1, (barge and 0 or 16) do
    local waiter = redis.call('ZPOPMIN', queue)[1]
    if not waiter then break end
    local wants = redis.call('GET', b .. '${K_WAITER}' .. waiter)
    if wants then
      -- '<lease ms>:<holder info>', or from ACQUIRE_SLOTS '<lease ms>/<group>:<holder info>'
      local lease, group, info = string.match(wants, '^(%d+)/?([^:]*):(.*)$')
      lease = tonumber(lease)
      local now, now_us = clock()
      local next_fence = math.max(now_us, tonumber(fence) + 1)
      local ttl = key_ttl(lease)
      if slots ~= '1' then
        next_fence = math.max(next_fence, tonumber(redis.call('GET', b .. '${K_FENCE}') or 0) + 1)
        redis.call('SET', b .. '${K_FENCE}', string.format('%.0f', next_fence), 'PX', ttl)
      end
      local expiry = string.format('%.0f', now + lease)
      next_fence = string.format('%.0f', next_fence)
      local more = redis.call('ZCARD', queue) > 0 and '1' or '0'
      redis.call('SET', key, format_value(expiry, more, waiter, next_fence, info), 'PX', ttl)
      local grant = b .. '${K_GRANT}' .. waiter
      redis.call('RPUSH', grant, next_fence .. ':' .. expiry .. ':' .. key)
      redis.call('PEXPIRE', grant, ${GRANT_TTL_MS})
      if slot then index_held(b, slot, expiry, waiter, group, ttl, false) end
      done()
      return 3
    end
  end
  redis.call('DEL', key)  -- first: a write that never needs memory
  if slot then index_free(b, slot) end
  done()
  redis.call('RPUSH', b .. '${K_SIGNAL}', '1')
  redis.call('PEXPIRE', b .. '${K_SIGNAL}', ${SIGNAL_TTL_MS})
  return 2
end

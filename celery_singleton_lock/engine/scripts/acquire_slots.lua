-- ACQUIRE_SLOTS: a lock with N slots (lock_limit): slot 1 is the lock key, slot i >= 2 is
-- <base>${K_SLOT}<i>; each slot holds an ordinary lock value. Takes our own or the claimed
-- slot, else a free or expired one, else queues the caller as ACQUIRE does.
-- KEYS[1] lock key (slot 1), KEYS[2] waiters' queue <base>${K_QUEUE}
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] holder info, ARGV[4] mode (as ACQUIRE),
-- ARGV[5] the longest the caller blocks between tries (ms), ARGV[6] N, ARGV[7] a token
-- prefix no two slots may share ('' none: a task's deliveries never hold two slots),
-- ARGV[8] (optional) a claimed owner token
-- returns {1, fencing token, expiry ms, slot key} when acquired,
--         {0, ms until the first held slot's lease ends (>= 1)} when every slot is held
-- The highest fencing token issued across the slots is kept in <base>${K_FENCE}.
--@include clock
--@include lease
--@include value
--@include base
--@include waiters
local now, fence = clock()
local lease = tonumber(ARGV[2])
local ttl = key_ttl(lease)
local b = base(KEYS[1])
local slots = {KEYS[1]}
for i = 2, tonumber(ARGV[6]) do slots[i] = b .. '${K_SLOT}' .. i end
local values = redis.call('MGET', unpack(slots))
local group = ARGV[7]
local mine, free, kept, grouped, soonest = nil, nil, nil, false, nil
local flags = {}
for i, current in ipairs(values) do
  if not current then
    free = free or i
  else
    local held_until, flag_at, old_fence, owner = parse(current)
    local left = nil
    if owner == ARGV[1] or (ARGV[8] and owner == ARGV[8]) then
      mine, kept = i, old_fence
    elseif held_until == nil then
      left = redis.call('PTTL', slots[i])
      if left <= 0 then free = free or i; left = nil end
    elseif held_until > now then
      left = held_until - now
      if group ~= '' and owner and string.sub(owner, 1, string.len(group)) == group then
        grouped = true  -- another delivery of this task holds a slot
      end
      if flag_at and string.sub(current, flag_at + 1, flag_at + 1) == '0' then
        flags[#flags + 1] = {slots[i], flag_at}
      end
    else
      free = free or i  -- an expired lease
    end
    if left and (soonest == nil or left < soonest) then soonest = left end
  end
end
local take = mine or ((not grouped) and free) or nil
if take then
  if mine then
    fence = kept
  else
    local last = tonumber(redis.call('GET', b .. '${K_FENCE}') or 0)
    if last >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, last + 1)
    redis.call('SET', b .. '${K_FENCE}', string.format('%.0f', fence), 'PX', ttl)
  end
  local expiry = now + lease
  redis.call('SET', slots[take], format_value(expiry, ARGV[4] == '1' and '1' or '0', ARGV[1],
    fence, ARGV[3]), 'PX', ttl)
  if ARGV[4] == '1' then leave(b, KEYS[2], ARGV[1]) end
  return {1, fence, expiry, slots[take]}
end
if ARGV[4] ~= 'x' and not grouped then
  for _, flag in ipairs(flags) do redis.call('SETRANGE', flag[1], flag[2], '1') end
  local keep = math.min(soonest or 1, tonumber(ARGV[5])) + ${WAITER_SLACK_MS}
  redis.call('ZADD', KEYS[2], 'NX', fence, ARGV[1])
  redis.call('SET', b .. '${K_WAITER}' .. ARGV[1], ARGV[2] .. ':' .. ARGV[3], 'PX', keep)
  redis.call('PEXPIRE', KEYS[2], keep + 1000)
  redis.call('DEL', b .. '${K_GRANT}' .. ARGV[1])
end
return {0, math.max(1, soonest or 1)}

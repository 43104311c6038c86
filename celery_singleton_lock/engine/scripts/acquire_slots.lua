-- ACQUIRE_SLOTS: a lock with N slots (lock_limit): slot 1 is the lock key, slot i >= 2 is
-- <base>${K_SLOT}<i>; each slot holds an ordinary lock value. Takes our own or the claimed
-- slot, else a free or expired one, else queues the caller as ACQUIRE does.
-- KEYS[1] lock key (slot 1), KEYS[2] waiters' queue <base>${K_QUEUE}
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] holder info, ARGV[4] mode (as ACQUIRE),
-- ARGV[5] the longest the caller blocks between tries (ms), ARGV[6] N, ARGV[7] a token
-- prefix no two slots may share ('' none: a task's deliveries never hold two slots),
-- ARGV[8] (optional) a claimed owner token ('' none), ARGV[9] (optional) stacked limits
-- (lib/stack.lua), taken with the slot in this step or not at all, ARGV[10] (optional) a
-- task id: when the key's done set (lib/finished.lua) records that its run finished,
-- nothing is taken
-- returns {1, fencing token, expiry ms, slot key} when acquired, {2} when ARGV[10]'s run
--         finished,
--         {0, ms until the first held slot's lease ends (>= 1)} when every slot is held,
--         {0, ms until a share of it ends (>= 1), limit name} when a slot is free (or
--         ours) but the weight does not fit in that limit
--         {0, 0, limit name, its number, the weight} when a slot is free (or ours) but the
--         weight is above that limit's number (not 0: a pause): it can never fit, so the
--         try is refused (the caller leaves the waiters' queue and its limits' lines)
-- The highest fencing token issued across the slots is kept in <base>${K_FENCE}.
-- The cost does not grow with N: the slot index (lib/slots.lua) names the candidates, in
-- O(log N) each: our own (or the claimed) slot, then the lowest-numbered free slot, then
-- the one expired longest, then a slot never used yet (the next number, while fewer than N
-- are indexed). Each is checked against its value before it is taken, and the index
-- corrected where it was wrong, at most ${SLOT_PROBES} of them per call: a wrong or missing
-- index costs tries, never a second holder of a slot, nor a slot numbered above N.
--@include clock
--@include lease
--@include value
--@include base
--@include waiters
--@include slots
--@include stack
local now, fence = clock()
local now_us = fence
local token, claim, group = ARGV[1], ARGV[8] ~= '' and ARGV[8] or nil, ARGV[7]
local stack = stack_spec(ARGV[9])
if ARGV[10] and ARGV[10] ~= '' and redis.call('ZSCORE', base(KEYS[1]) .. '${K_DONE}', ARGV[10]) then
  return {2}
end
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[6])
local ttl = key_ttl(lease)
local b = base(KEYS[1])
local index, owners = b .. '${K_SLOTS}', b .. '${K_OWNERS}'

-- state(i, its value if read already) -> what slot i's value says: 'free'; 'expired', its
-- fencing token; 'ours' (our token or the claimed one, whatever its expiry), its fencing
-- token; 'held', the end of its lease, its owner token (nil for a value of another layout)
local function state(i, current)
  local key = slot_key(KEYS[1], b, i)
  if current == nil then current = redis.call('GET', key) end
  if not current then return 'free', 0 end
  local held_until, _, old_fence, owner = parse(current)
  if owner and (owner == token or owner == claim) then return 'ours', old_fence end
  if held_until == nil then
    -- a value of another layout: held while its key has a TTL, and never overwritten
    -- silently when it has none
    local left = redis.call('PTTL', key)
    if left > 0 then return 'held', now + left, nil end
    error({err = '${FOREIGN_VALUE}' .. key})
  end
  if held_until > now then return 'held', held_until, owner end
  return 'expired', old_fence
end

-- a slot number read from the index or the owners' hash, or nil
local function slot_number(text)
  local i = text and tonumber(text)
  if i and i >= 1 and i <= ${MAX_LIMIT} and tostring(i) == text then return i end
  return nil
end

local function of_group(owner)
  return group ~= '' and owner ~= nil and string.sub(owner, 1, string.len(group)) == group
end

-- Our own slot (a hold under our token, perhaps handed to us, or under the claimed one),
-- and the slot our group holds, as the owners' hash names them (their values read at once).
local fields = {token, claim or token, group ~= '' and (':g' .. group) or token}
local known = redis.call('HMGET', owners, unpack(fields))
local numbers, keys, values = {}, {}, {}
for k = 1, 3 do
  local i = slot_number(known[k])
  known[k] = i
  if i and not values[i] then
    values[i] = true
    numbers[#numbers + 1] = i
    keys[#keys + 1] = slot_key(KEYS[1], b, i)
  end
end
if #keys > 0 then
  local read = redis.call('MGET', unpack(keys))
  for j, i in ipairs(numbers) do values[i] = read[j] end
end
local take, kept, create, grouped = nil, nil, false, false
for k = 1, 2 do
  local i = known[k]
  if i and not take then
    local what, old_fence = state(i, values[i])
    if what == 'ours' then take, kept = i, old_fence end
  end
end
if not take and group ~= '' then
  local i = known[3]
  if i then
    local what, a, owner = state(i, values[i])
    if what == 'ours' then
      take, kept = i, a
    elseif what == 'held' and of_group(owner) then
      grouped = true  -- another delivery of this task holds a slot
    end
  end
end

-- Else the candidates the index names, each checked against its value.
local old = 0  -- the fencing token of the value we take over
local corrected = 0  -- the longest lease left among the slots the index was corrected for
if not take and not grouped then
  local skip = 0  -- expired slots of a larger N passed over
  for _ = 1, ${SLOT_PROBES} do
    local i, listed, score, beyond = nil, nil, nil, skip > 0
    if not beyond then
      -- the lowest score up to now: the lowest-numbered free slot (free slots score their
      -- numbers, below every lease end), else the slot expired longest
      local found = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
      listed, score = found[1], tonumber(found[2])
      if listed and score <= ${MAX_LIMIT} and score > n then beyond = true end  -- a larger N's
    end
    if beyond then
      listed = redis.call('ZRANGEBYSCORE', index, '(${MAX_LIMIT}', now, 'LIMIT', skip, 1)[1]
      score = nil
    end
    if listed then
      i = slot_number(listed)
      if i and score and score <= ${MAX_LIMIT} and score ~= i then
        redis.call('ZADD', index, i, i)  -- a free score that is not its number: made so
        i = nil
      elseif i and i > n then
        skip, i = skip + 1, nil  -- an expired slot of a larger N
      end
    else
      local count = redis.call('ZCARD', index)
      if count >= n then break end
      i, create = count + 1, true  -- a slot never used yet
    end
    if listed and not slot_number(listed) then
      redis.call('ZREM', index, listed)  -- not a slot number: not ours to keep
    end
    if i then
      local what, a, owner = state(i)
      if what == 'ours' then
        take, kept = i, a
        break
      elseif what == 'free' or what == 'expired' then
        take, old = i, a
        break
      end
      redis.call('ZADD', index, a, i)  -- held: the index now says until when
      corrected = math.max(corrected, a - now)
      create = false
      if of_group(owner) then
        grouped = true
        break
      end
    end
  end
end

-- a corrected (perhaps recreated) index outlives the leases it now knows of
if corrected > 0 then keep_index(b, key_ttl(corrected)) end
if take and stack then
  local limit, wait, heavy, number = stack_blocked(stack, token, now, now_us,
    ARGV[4] ~= 'x' and tonumber(ARGV[5]) + ${WAITER_SLACK_MS} or nil, claim)
  if heavy then
    if ARGV[4] == '1' then leave(b, KEYS[2], token) end
    stack_unline(stack, token, claim)
    return {0, 0, heavy, number, stack.w}
  end
  if limit then return {0, wait, limit} end
end
if take then
  if kept then
    fence = kept
  else
    local last = tonumber(redis.call('GET', b .. '${K_FENCE}') or 0)
    if last >= MAX_EXACT or old >= MAX_EXACT then
      return redis.error_reply('fencing token of ' .. KEYS[1] .. ' is at its limit (2^53 - 1)')
    end
    fence = math.max(fence, last + 1, old + 1)
    redis.call('SET', b .. '${K_FENCE}', string.format('%.0f', fence), 'PX', ttl)
  end
  local expiry = now + lease
  local key = slot_key(KEYS[1], b, take)
  redis.call('SET', key, format_value(expiry, ARGV[4] == '1' and '1' or '0', token, fence,
    ARGV[3]), 'PX', ttl)
  index_held(b, take, expiry, token, group, ttl, create)
  if stack then stack_take(b, stack, ARGV[9], token, expiry, ttl, claim) end
  if ARGV[4] == '1' then leave(b, KEYS[2], token) end
  return {1, fence, expiry, key}
end
-- Every slot held (or our group holds one): until when, by the index.
local first = redis.call('ZRANGEBYSCORE', index, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local soonest = first[2] and (tonumber(first[2]) - now) or 1
if ARGV[4] ~= 'x' and not grouped then
  -- A release of any slot hands it to the first live waiter (lib/release.lua looks at the
  -- queue): nothing to flag. The waiter's group travels with its place, so the slot it is
  -- handed counts as its group's.
  local keep = math.min(soonest, tonumber(ARGV[5])) + ${WAITER_SLACK_MS}
  local wants = ARGV[2] .. (group ~= '' and ('/' .. group) or '') .. ':' .. ARGV[3]
  redis.call('ZADD', KEYS[2], 'NX', fence, token)
  redis.call('SET', b .. '${K_WAITER}' .. token, wants, 'PX', keep)
  redis.call('PEXPIRE', KEYS[2], keep + 1000)
  redis.call('DEL', b .. '${K_GRANT}' .. token)
end
return {0, math.max(1, soonest)}

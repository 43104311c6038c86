--@include clock
--@include value
--@include write
--@include slots
-- The park queue of a key (lock_on_conflict="park"): the sorted set <base>${K_PARKED} of
-- parked task ids (score: their turn), the hash <base>${K_PARKDATA} of each parked call
-- ("<grant token>\n<grant holder info>\n<payload>"; the payload is the caller's, passed
-- through), and the sorted set <base>${K_GRANTED} of calls handed the key but not started
-- yet (score: server ms of the hand-off), which a sweep hands out again if they never start.

-- parked_entry(text) -> grant token, holder info, payload
local function parked_entry(entry)
  return string.match(entry, '^([^\n]*)\n([^\n]*)\n(.*)$')
end

-- in_turn(base, task id, slots) -> whether the call may hold the key by its turn
-- (lock_order="enqueue"): it is one of the first slots outstanding calls of the key, or
-- not in the line at all (left it: its deadline passed). Without a line, always.
local function in_turn(b, id, slots, ordered)
  if not ordered then return true end
  local rank = redis.call('ZRANK', b .. '${K_ORDER}', id)
  return rank == false or rank < slots
end

-- grant(key, base, old value or nil, lease ms, slots, ordered) -> task id and payload of
-- the first parked call, which holds key (the lock key, or a slot of a lock with slots > 1)
-- from now on under its grant token (a new fencing token); nil when nobody is parked, or
-- (ordered) when the first parked call's turn has not come (a call before it is on its way)
local function grant(key, b, current, lease, slots, ordered)
  local parked, data, granted = b .. '${K_PARKED}', b .. '${K_PARKDATA}', b .. '${K_GRANTED}'
  while true do
    local head = redis.call('ZRANGE', parked, 0, 0)[1]
    if not head then return nil end
    if not in_turn(b, head, slots, ordered) then return nil end
    redis.call('ZREM', parked, head)  -- first: a write that never needs memory
    local entry = redis.call('HGET', data, head)
    if entry then
      local token, info, payload = parked_entry(entry)
      local now, now_us = clock()
      local fence = now_us
      if current then
        local _, _, old = parse(current)
        if old then fence = math.max(now_us, old + 1) end
      end
      if slots > 1 then
        local last = tonumber(redis.call('GET', b .. '${K_FENCE}') or 0)
        fence = math.max(fence, last + 1)
        redis.call('SET', b .. '${K_FENCE}', string.format('%.0f', fence), 'PX', key_ttl(lease))
      end
      write(key, token, fence, info, now, lease)
      if slots > 1 then
        local _, i = slot_of(key)
        local group = string.match(token, '^(t%x+%-)q$') or ''
        index_held(b, i, now + lease, token, group, key_ttl(lease), false)
      end
      redis.call('ZADD', granted, now, head)
      redis.call('PEXPIRE', granted, math.max(redis.call('PTTL', data), key_ttl(lease)))
      return head, payload
    end
  end
end

-- free_slot(base, lock key, now, slots) -> a key of this lock that is free now (the lock
-- key itself, or with slots a free or expired slot the index names, checked against its
-- value), and its old value; nil when every slot is held (or the index cannot say)
local function free_slot(name, b, now, slots)
  if slots <= 1 then
    local current = redis.call('GET', name)
    if not current then return name, nil end
    local until_ms = parse(current)
    if until_ms ~= nil and until_ms <= now then return name, current end
    if until_ms == nil and redis.call('PTTL', name) <= 0 then return nil end  -- foreign
    return nil
  end
  for _, i in ipairs(redis.call('ZRANGEBYSCORE', b .. '${K_SLOTS}', '-inf', now, 'LIMIT', 0, 4)) do
    local n = tonumber(i)
    if n and n >= 1 and n <= slots then
      local key = slot_key(name, b, n)
      local current = redis.call('GET', key)
      if not current then return key, nil end
      local until_ms = parse(current)
      if until_ms ~= nil and until_ms <= now then return key, current end
    end
  end
  return nil
end

-- Stacked limits (RedisLock(stack=...), lock_limits): besides its own key, a hold may take
-- a share of several limits at once, e.g. 'tenant:7' (5) and 'global:exports' (50). A
-- limit is a sorted set of '<weight>:<owner token>' scored by the end of that holder's
-- lease, so a crashed holder's share ends with its lease (the first take after that prunes
-- it). The stack travels as a JSON spec:
--   {"w": weight, "c": capacities hash, "l": [[limit key, name, template, number, wake list], ...]}
-- and, while held, is recorded beside the lock as <base>${K_STACK}<owner token> (the same
-- spec), so that release and extend find it whatever the caller passed. Every key of a
-- stack shares one hash tag with the lock key (keyspace: the stack's tag), so one script
-- takes them all on Redis Cluster.
-- A limit's number is read from the capacities hash, by its name, then by its template (as
-- `locks limit set` writes them), else the spec's number: lowering it holds back new takes
-- only; nothing held is ever taken away.

-- stack_spec(text) -> the decoded spec, or nil for none ('' or absent)
local function stack_spec(text)
  if text == nil or text == '' then return nil end
  local ok, spec = pcall(cjson.decode, text)
  if not ok or type(spec) ~= 'table' or type(spec.l) ~= 'table' or type(spec.c) ~= 'string' then
    error({err = 'ERR stacked limits: unreadable spec'})
  end
  spec.w = math.floor(tonumber(spec.w) or 1)
  return spec
end

-- stack_number(spec, limit) -> the limit's number now (>= 0)
local function stack_number(spec, limit)
  local set = redis.call('HMGET', spec.c, limit[2], limit[3])
  for k = 1, 2 do
    local n = tonumber(set[k])
    if n and n >= 0 and n == math.floor(n) then return n end
  end
  return tonumber(limit[4]) or 0
end

-- stack_used(limit key, now, member to leave out) -> the weight held in it, and the end of
-- the soonest lease among its holders (nil when none). Expired shares go first. A member
-- of another layout counts as weight 1 until its score passes: never as room.
local function stack_used(key, now, mine)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local members = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local used, soonest = 0, nil
  for i = 1, #members, 2 do
    local member = members[i]
    if member ~= mine then
      local w = tonumber(string.match(member, '^(%d+):'))
      used = used + ((w and w >= 1) and w or 1)
      local ends = tonumber(members[i + 1])
      if ends and (soonest == nil or ends < soonest) then soonest = ends end
    end
  end
  return used, soonest
end

-- stack_blocked(spec, token, now) -> nil when the weight fits in every limit; else the
-- name of the first limit it does not fit in and the ms until a share of it ends (>= 1;
-- 1000 when nothing held there will end: the number itself is too low)
local function stack_blocked(spec, token, now)
  local mine = spec.w .. ':' .. token
  for _, limit in ipairs(spec.l) do
    local used, soonest = stack_used(limit[1], now, mine)
    if used + spec.w > stack_number(spec, limit) then
      return limit[2], soonest and math.max(1, soonest - now) or 1000
    end
  end
  return nil
end

-- keep(key, ttl): a limit outlives the leases in it (as the slot index does)
local function stack_keep(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, 2 * ttl) end
end

-- stack_take(base, spec, text of the spec, token, expiry ms, key TTL ms): the hold's share
-- of every limit, and its record
local function stack_take(b, spec, text, token, expiry, ttl)
  local mine = spec.w .. ':' .. token
  for _, limit in ipairs(spec.l) do
    redis.call('ZADD', limit[1], expiry, mine)
    stack_keep(limit[1], ttl)
  end
  redis.call('SET', b .. '${K_STACK}' .. token, text, 'PX', ttl)
end

-- stack_drop(base, token) -> true when the hold had a stack: its shares and record go, and
-- the waiters of each limit get word (as many wake-ups as the weight freed, at most 16)
local function stack_drop(b, token)
  local record = b .. '${K_STACK}' .. token
  local text = redis.call('GET', record)
  if not text then return false end
  redis.call('DEL', record)  -- first: a write that never needs memory
  local ok, spec = pcall(cjson.decode, text)
  if not ok or type(spec) ~= 'table' or type(spec.l) ~= 'table' then return true end
  local mine = math.floor(tonumber(spec.w) or 1) .. ':' .. token
  for _, limit in ipairs(spec.l) do
    redis.call('ZREM', limit[1], mine)
    if limit[5] then
      local wakes = {}
      for k = 1, math.min(16, math.max(1, tonumber(spec.w) or 1)) do wakes[k] = '1' end
      redis.call('RPUSH', limit[5], unpack(wakes))
      redis.call('PEXPIRE', limit[5], ${SIGNAL_TTL_MS})
    end
  end
  return true
end

-- stack_extend(base, token, expiry ms, key TTL ms, now) -> false when the hold lost a share
-- it cannot get back (its lease ended, the share was pruned, and it no longer fits); true
-- otherwise (also for a hold without a stack)
local function stack_extend(b, token, expiry, ttl, now)
  local record = b .. '${K_STACK}' .. token
  local text = redis.call('GET', record)
  if not text then return true end
  local ok, spec = pcall(cjson.decode, text)
  if not ok or type(spec) ~= 'table' or type(spec.l) ~= 'table' then return true end
  spec.w = math.floor(tonumber(spec.w) or 1)
  local mine = spec.w .. ':' .. token
  for _, limit in ipairs(spec.l) do
    if not redis.call('ZSCORE', limit[1], mine) then
      local used = stack_used(limit[1], now, mine)
      if used + spec.w > stack_number(spec, limit) then return false end
    end
  end
  for _, limit in ipairs(spec.l) do
    redis.call('ZADD', limit[1], expiry, mine)
    stack_keep(limit[1], ttl)
  end
  redis.call('PEXPIRE', record, ttl)
  return true
end

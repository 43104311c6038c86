-- Stacked limits (RedisLock(stack=...), lock_limits): besides its own key, a hold may take
-- a share of several limits at once, e.g. 'tenant:7' (5) and 'global:exports' (50). A
-- limit is a sorted set of '<weight>:<owner token>' scored by the end of that holder's
-- lease, so a crashed holder's share ends with its lease (the first take after that prunes
-- it). The stack travels as a JSON spec:
--   {"w": weight, "c": capacities hash,
--    "l": [[limit key, name, template, number, wake list, waiters' line], ...]}
-- and, while held, is recorded beside the lock as <base>${K_STACK}<owner token> (the same
-- spec), so that release and extend find it whatever the caller knows (they are told only
-- that the lock is stacked). Every key of a
-- stack shares one hash tag with the lock key (keyspace: the stack's tag), so one script
-- takes them all on Redis Cluster.
-- A limit's number is read from the capacities hash, by its name, then by its template (as
-- `locks limit set` writes them), else the spec's number: lowering it holds back new takes
-- only; nothing held is ever taken away.
-- No starvation: a blocking try held back by a limit joins that limit's line of waiters (a
-- sorted set of '<weight>:<owner token>' scored by the caller's arrival, in server us: when
-- it first waited in any of its limits' lines, so every line orders two waiters alike;
-- beside a hash of how long each is known to wait: its place lapses when it stops trying). Every take, waiting
-- or not, leaves room for the weight of the waiters ahead of it (the first ${STACK_AHEAD}
-- of the line, those whose weight can fit at all): so light runs that keep coming never
-- pass a heavy one for ever; it gets in once the shares ahead of it drain.
-- A weight above a limit's number (as it applies now) could never get in, however long it
-- waited: stack_blocked says so apart from "no room now", before the caller joins any line,
-- and the acquire scripts refuse such a try for good. A number of 0 is a pause (every new
-- run is held back until it is raised), never a refusal.

--@include holdback

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

-- checked(reply, key) -> reply; a key of the stack planted with another type of value is a
-- clear error naming it (a planted value never reads as room, nor as a crash)
local function checked(reply, key)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      error({err = 'ERR stacked limits: key ' .. key .. ' holds a value of another type; '
        .. 'it is not a limit of this package (delete it)'})
    end
    error(reply)
  end
  return reply
end

-- stack_number(spec, limit) -> the limit's number now (>= 0)
local function stack_number(spec, limit)
  local set = checked(redis.pcall('HMGET', spec.c, limit[2], limit[3]), spec.c)
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
  checked(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now), key)
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

-- stack_ahead(limit, number, arrival us, now) -> the weight of the live waiters in the
-- limit's line that came before the caller (its arrival: when it first waited for any of
-- its limits, or now); lapsed places go. Every line is ordered by that one arrival, so two
-- waiters never leave room for each other (the older one is ahead in every line).
local function stack_ahead(limit, number, arrival, now)
  local line = limit[6]
  if not line then return 0 end
  local alive = line .. ':alive'
  local first = checked(redis.pcall('ZRANGEBYSCORE', line, '-inf',
    '(' .. string.format('%.0f', arrival), 'LIMIT', 0, ${STACK_AHEAD}), line)
  if #first == 0 then return 0 end
  local until_ms = checked(redis.pcall('HMGET', alive, unpack(first)), alive)
  local ahead, lapsed = 0, {}
  for k, member in ipairs(first) do
    if (tonumber(until_ms[k]) or 0) <= now then
      lapsed[#lapsed + 1] = member
    else
      local w = tonumber(string.match(member, '^(%d+):')) or 1
      if w <= number then ahead = ahead + w end  -- one too heavy to fit holds nobody up
    end
  end
  if #lapsed > 0 then
    redis.call('ZREM', line, unpack(lapsed))
    redis.call('HDEL', alive, unpack(lapsed))
  end
  return ahead
end

-- stack_unline(spec, token, place token or nil): the caller's places in its limits' lines
-- go (a try refused for good waits no more)
local function stack_unline(spec, token, place_token)
  local members = {spec.w .. ':' .. token, spec.w .. ':' .. (place_token or token)}
  for _, limit in ipairs(spec.l) do
    if limit[6] then
      redis.call('ZREM', limit[6], unpack(members))
      redis.call('HDEL', limit[6] .. ':alive', unpack(members))
    end
  end
end

-- stack_blocked(spec, token, now, now us, keep ms or nil, place token or nil) -> nil when
-- the weight fits in every limit, with room left for the waiters ahead; else the name of
-- the first limit it does not fit in and the ms until a share of it ends (>= 1; 1000 when
-- nothing held there will end). With keep (a try that will wait), the caller joins the
-- line of every limit it does not fit in, its place kept keep ms, under the place token
-- (a call that comes back as another delivery keeps it: its claim) or its own.
-- A weight above a limit's number (other than 0, a pause) can never fit: then nil, nil,
-- the name of the first such limit and its number, and the caller joins no line (to a caller that reads only
-- the first value, such a call "fits now": it goes on to its acquire, which refuses it).
local function stack_blocked(spec, token, now, now_us, keep, place_token)
  local numbers = {}
  for i, limit in ipairs(spec.l) do
    numbers[i] = stack_number(spec, limit)
    if numbers[i] > 0 and spec.w > numbers[i] then return nil, nil, limit[2], numbers[i] end
  end
  local mine = spec.w .. ':' .. token
  local place = spec.w .. ':' .. (place_token or token)
  local arrival = now_us  -- when it first waited, in any of its limits' lines
  for _, limit in ipairs(spec.l) do
    if limit[6] then
      local since = tonumber(checked(redis.pcall('ZSCORE', limit[6], place), limit[6]))
      if since and since < arrival then arrival = since end
    end
  end
  local blocked, wait = nil, nil
  for i, limit in ipairs(spec.l) do
    local used, soonest = stack_used(limit[1], now, mine)
    local number = numbers[i]
    if used + spec.w + stack_ahead(limit, number, arrival, now) > number then
      if not blocked then
        blocked, wait = limit[2], soonest and math.max(1, soonest - now) or 1000
      end
      if not keep then break end
      if limit[6] then
        local alive = limit[6] .. ':alive'
        redis.call('ZADD', limit[6], 'NX', string.format('%.0f', arrival), place)
        redis.call('HSET', alive, place, now + keep)
        for _, key in ipairs({limit[6], alive}) do  -- outlives every place in it
          if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
        end
      end
    end
  end
  return blocked, wait
end

-- keep(key, ttl): a limit outlives the leases in it (as the slot index does)
local function stack_keep(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, 2 * ttl) end
end

-- stack_take(base, spec, text of the spec, token, expiry ms, key TTL ms, place token or
-- nil): the hold's share of every limit, and its record; its places in lines go
local function stack_take(b, spec, text, token, expiry, ttl, place_token)
  local mine = spec.w .. ':' .. token
  local place = spec.w .. ':' .. (place_token or token)
  for _, limit in ipairs(spec.l) do
    redis.call('ZADD', limit[1], expiry, mine)
    stack_keep(limit[1], ttl)
    if limit[6] and redis.call('ZREM', limit[6], mine, place) > 0 then
      redis.call('HDEL', limit[6] .. ':alive', mine, place)  -- a waiter that got in
    end
  end
  redis.call('SET', b .. '${K_STACK}' .. token, text, 'PX', ttl)
end

-- stack_drop(base, token) -> true when the hold had a stack: its shares and record go, and
-- the waiters in each limit's line get word (one wake-up for each of the first
-- STACK_AHEAD: all of them try again, and the line's order decides who gets in); when
-- someone waits in a line, a worker's sweep of the calls held back in the lock Redis
-- (lib/holdback.lua) is woken too
local function stack_drop(b, token)
  local record = b .. '${K_STACK}' .. token
  local text = redis.call('GET', record)
  if not text then return false end
  redis.call('DEL', record)  -- first: a write that never needs memory
  local ok, spec = pcall(cjson.decode, text)
  if not ok or type(spec) ~= 'table' or type(spec.l) ~= 'table' then return true end
  local mine = math.floor(tonumber(spec.w) or 1) .. ':' .. token
  local waited = false
  for _, limit in ipairs(spec.l) do
    redis.call('ZREM', limit[1], mine)
    local waiting = limit[6] and math.min(${STACK_AHEAD}, redis.call('ZCARD', limit[6])) or 0
    if waiting > 0 then waited = true end
    if limit[5] and waiting > 0 then
      local wakes = {}
      for k = 1, waiting do wakes[k] = '1' end
      redis.call('RPUSH', limit[5], unpack(wakes))
      redis.call('PEXPIRE', limit[5], ${SIGNAL_TTL_MS})
    end
  end
  -- a call held back in the lock Redis keeps a place in the line of each limit that holds
  -- it back: with nobody in those lines, there is nobody to wake
  if waited and type(spec.c) == 'string' then held_wake(held_base(spec)) end
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

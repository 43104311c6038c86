-- PARK_SWEEP: what workers do now and then for a key with parked calls, so that none is
-- lost: a call handed the key but not started within ARGV[1] ms (its releasing process
-- died before publishing it, or its message was lost) is handed out again for publishing;
-- and a free key (its holder died without releasing, a success hold ran out) goes to the
-- first parked call. A handed call another copy of its message runs already (it took the
-- grant under a token of its own) counts as started.
-- KEYS[1] lock key
-- ARGV[1] how long a handed-off call may take to start (ms), ARGV[2] the lease of a grant
-- (ms), ARGV[3] the most calls handed out again at once, ARGV[4] the number of slots,
-- ARGV[5] '1' when the key's calls run in order (lock_order="enqueue"): calls whose
-- deadline passed (their message never came) leave the line first
-- returns {active, task id, payload, ...}: active 1 while something is parked or handed
--         off (0: the key can leave the sweep's list); then the calls to publish
--@include park
local b = base(KEYS[1])
local parked, data, granted = b .. '${K_PARKED}', b .. '${K_PARKDATA}', b .. '${K_GRANTED}'
local now = clock()
local slots = tonumber(ARGV[4])
local ordered = ARGV[5] == '1'
local out = {0}
if ordered then
  local line, due = b .. '${K_ORDER}', b .. '${K_ORDER_DUE}'
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', line, id)
    redis.call('ZREM', due, id)
  end
end
-- running_copy(task id, its grant token) -> whether another copy of that call's message
-- (the same task id: a redelivery) took the grant over and holds the key, or the slot its
-- group holds, under a token of its own: the call runs, and must not be handed out again
local function running_copy(id, grant_token)
  local key = KEYS[1]
  if slots > 1 then
    local group = string.match(grant_token or '', '^(t%x+%-)q$')
    if not group then return false end
    local i = tonumber(redis.call('HGET', b .. '${K_OWNERS}', ':g' .. group) or '')
    if not i or i < 1 or i > slots then return false end
    key = slot_key(KEYS[1], b, i)
  end
  local current = redis.call('GET', key)
  if not current then return false end
  local until_ms, _, _, owner = parse(current)
  if not until_ms or until_ms <= now or owner == nil or owner == grant_token then return false end
  local _, _, _, info = fields(current)
  if not info then return false end
  -- the holder info is JSON, written compact by the task layer, with spaces by RedisLock
  return string.find(info, '"task_id":"' .. id .. '"', 1, true) ~= nil
    or string.find(info, '"task_id": "' .. id .. '"', 1, true) ~= nil
end
local stale = redis.call('ZRANGEBYSCORE', granted, '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[3]))
for _, id in ipairs(stale) do
  local entry = redis.call('HGET', data, id)
  if entry and running_copy(id, (parked_entry(entry))) then
    redis.call('ZREM', granted, id)  -- it started, as PARK_STARTED records
    redis.call('HDEL', data, id)
  elseif entry then
    redis.call('ZADD', granted, now, id)
    local _, _, payload = parked_entry(entry)
    out[#out + 1] = id
    out[#out + 1] = payload
  else
    redis.call('ZREM', granted, id)
  end
end
while redis.call('ZCARD', parked) > 0 do
  local free, current = free_slot(KEYS[1], b, now, slots)
  if not free then break end
  local head, payload = grant(free, b, current, tonumber(ARGV[2]), slots, ordered)
  if not head then break end
  out[#out + 1] = head
  out[#out + 1] = payload
end
local waiting = redis.call('ZCARD', parked) + redis.call('ZCARD', granted)
if ordered then waiting = waiting + redis.call('ZCARD', b .. '${K_ORDER}') end
if waiting > 0 then out[1] = 1 end
return out

-- HELD_SWEEP: what a worker's sweep does with the calls held back in the lock Redis
-- (lib/holdback.lua), woken by a release of a share, when a window opens, and now and then:
-- a call handed out more than ARGV[1] ms ago that did not start (the worker that was to
-- publish it died, or its message was lost) is handed out again; a call due (its window
-- opened, or held back by a limit) whose stack now fits, with room left for the waiters
-- ahead of it in each line, is handed out to be published, its places kept while its
-- message travels; one that still does not fit keeps its places. A call whose weight is
-- now above a limit's number (it was lowered) is handed out too: it never fits, and its
-- run's acquire refuses it for good.
-- KEYS[1] <sb>${S_HELD}, KEYS[2] <sb>${S_HELD_CALLS}, KEYS[3] <sb>${S_HELD_OUT}
-- ARGV[1] how long a handed-out call may take to start (ms), ARGV[2] how long the places of
-- a call that still does not fit are kept (ms), ARGV[3] how long those of a call handed out
-- are kept (ms), ARGV[4] the most calls looked at, ARGV[5] the task names the sweeping
-- worker can publish, one a line ('': every one); the calls of other tasks are left to
-- their workers
-- returns {active, ms until the next call is due (-1: none), task id, lock key, call, ...}:
--         active 1 while calls are held or handed out; then the calls to publish
--@include clock
--@include stack
local now, now_us = clock()
local most = tonumber(ARGV[4])
local known = nil
if ARGV[5] ~= '' then
  known = {}
  for name in string.gmatch(ARGV[5], '[^\n]+') do known[name] = true end
end
local out = {0, -1}
local function mine(call)
  return known == nil or known[string.match(call, '^([^\n]*)')] == true
end
local function hand_out(id, spec, place, key, call)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[3], now, id)
  local left = redis.call('PTTL', KEYS[2])
  if left > 0 then redis.call('PEXPIRE', KEYS[3], left) end
  if spec then held_places(spec, place, now, tonumber(ARGV[3])) end
  out[#out + 1] = id
  out[#out + 1] = key
  out[#out + 1] = call
end
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0, most)
for _, id in ipairs(stale) do
  local entry = redis.call('HGET', KEYS[2], id)
  if not entry then
    redis.call('ZREM', KEYS[3], id)
  else
    local text, place, key, call = held_entry(entry)
    if call and mine(call) then hand_out(id, stack_spec(text), place, key, call) end
  end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, most)
for _, id in ipairs(due) do
  local entry = redis.call('HGET', KEYS[2], id)
  if not entry then
    redis.call('ZREM', KEYS[1], id)
  else
    local text, place, key, call = held_entry(entry)
    if call and mine(call) then
      local spec = stack_spec(text)
      local blocked = spec and stack_blocked(spec, place, now, now_us, tonumber(ARGV[2]), place)
      if blocked then
        held_places(spec, place, now, tonumber(ARGV[2]))
      else
        hand_out(id, spec, place, key, call)
      end
    end
  end
end
local next_due = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if next_due[2] then out[2] = math.max(1, tonumber(next_due[2]) - now) end
if redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[3]) > 0 then out[1] = 1 end
return out

-- The calls a stacked limit or a rate holds back (lock_on_conflict="park", and queue-scope
-- calls that come back with their hold), kept under the application's stack base <sb>
-- until they fit, never in a worker:
--   <sb>${S_HELD}        a sorted set: task id -> the server ms from which it is due (a call
--                        held back by a limit: when it was held; it goes once it fits)
--   <sb>${S_HELD_CALLS}  a hash: task id -> '<stack spec>\n<place token>\n<lock key>\n<call>'
--                        (the spec and place '' for a call that only waits for its window)
--   <sb>${S_HELD_OUT}    a sorted set: task id -> the server ms it was handed out to be
--                        published; a sweep hands it out again if it never starts
--   <sb>${S_HELD_WAKE}   a list a release of a share pushes onto (when calls are held), so
--                        a worker's sweep of the held calls runs at once

-- held_entry(text) -> stack spec ('' none), place token, lock key, the call
local function held_entry(entry)
  return string.match(entry, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
end

-- held_base(spec) -> the stack base of a decoded spec (its capacities key less its suffix)
local function held_base(spec)
  return string.sub(spec.c, 1, string.len(spec.c) - string.len('${S_LIMITS}'))
end

-- held_wake(stack base): wake a worker's sweep of the held calls, when there are some and
-- no wake-up waits unread (a sweep that pops it looks at all of them)
local function held_wake(sb)
  local wake = sb .. '${S_HELD_WAKE}'
  if redis.call('ZCARD', sb .. '${S_HELD}') > 0 and redis.call('PTTL', wake) == -2 then
    redis.call('RPUSH', wake, '1')
    redis.call('PEXPIRE', wake, ${HELD_WAKE_TTL_MS})
  end
end

-- held_places(spec, place token, now, keep ms or nil): the places a held call has in the
-- lines of its limits are kept keep ms from now; with keep nil they go (it started, or a
-- late copy of it ended)
local function held_places(spec, place, now, keep)
  local member = math.floor(tonumber(spec.w) or 1) .. ':' .. place
  for _, limit in ipairs(spec.l) do
    local line = limit[6]
    if line and redis.call('ZSCORE', line, member) then
      local alive = line .. ':alive'
      if keep then
        redis.call('HSET', alive, member, now + keep)
        for _, key in ipairs({line, alive}) do
          if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
        end
      else
        redis.call('ZREM', line, member)
        redis.call('HDEL', alive, member)
      end
    end
  end
end

--@include value
-- held(lock key, now ms) -> whether it is held at server time now, and its value
local function held(key, now)
  local current = redis.call('GET', key)
  if not current then return false, nil end
  local held_until = parse(current)
  if held_until == nil then return redis.call('PTTL', key) > 0, current end
  return held_until > now, current
end

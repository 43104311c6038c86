-- clock() -> now in server milliseconds, now in server microseconds, and the TIME reply
-- itself ({seconds, microseconds} as strings). The one place a script reads the clock:
-- every lease, expiry and fencing token is on the server's clock, never a client's.
local function clock()
  local t = redis.call('TIME')
  local seconds, micros = tonumber(t[1]), tonumber(t[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros, t
end

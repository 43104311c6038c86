-- THROTTLE (lock_rate_limit): admit a start if fewer than N starts fall in the window.
-- KEYS[1] the starts of one lock key: sorted set <base>${K_STARTS} (score: server ms of a
-- start)
-- ARGV[1] N, the most starts per window (>= 1), ARGV[2] the window ms,
-- ARGV[3] who starts (a task id; the server time is appended: members are unique), or ''
-- to only look: nothing is recorded, and an admissible start answers {1, starts so far}
-- returns {1, starts in the window including this one}  admitted, and recorded
--         {0, ms until a start would be admitted (>= 1)}  over the limit: nothing recorded
--@include clock
local now, _, t = clock()
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- first: a write that never needs memory (it only frees)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
  if ARGV[3] == '' then return {1, count} end
  redis.call('ZADD', KEYS[1], now, ARGV[3] .. ':' .. t[1] .. '.' .. t[2])
  redis.call('PEXPIRE', KEYS[1], window + ${STARTS_TTL_SLACK_MS})
  return {1, count + 1}
end
-- The start at rank count - limit (oldest first) must leave the window before another fits.
local gate = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
local wait = tonumber(gate[2]) + window - now
if wait < 1 then wait = 1 end
return {0, wait}

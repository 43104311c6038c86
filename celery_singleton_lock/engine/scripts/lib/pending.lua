--@include held
-- The pending follow-up of a key (coalesce, replace): a hash <base>${K_PENDING} with the
-- follow-up's task id, owner token and holder info, and the call (body, ctype, encoding,
-- options). Its scripts ask whether the lock is held (lib/held.lua) too.
-- pend(follow-up key, ARGV, first): make the call in ARGV[first .. first + 7] (task id,
-- token, info, body, content type, encoding, options, keep ms) the follow-up, keeping the
-- task id, token and info of one made earlier -> the follow-up's task id
local function pend(key, ARGV, first)
  if redis.call('HEXISTS', key, 'id') == 0 then
    redis.call('HSET', key, 'id', ARGV[first], 'token', ARGV[first + 1], 'info', ARGV[first + 2])
  end
  redis.call('HSET', key, 'body', ARGV[first + 3], 'ctype', ARGV[first + 4],
    'encoding', ARGV[first + 5], 'options', ARGV[first + 6])
  redis.call('PEXPIRE', key, tonumber(ARGV[first + 7]))
  return redis.call('HGET', key, 'id')
end

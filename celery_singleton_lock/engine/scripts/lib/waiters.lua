-- leave(base, queue key, owner token): a waiter that got the lock drops its place in the
-- queue, its waiter key <base>${K_WAITER}<token> and any grant <base>${K_GRANT}<token>
-- left for it.
local function leave(b, queue, token)
  redis.call('ZREM', queue, token)
  redis.call('DEL', b .. '${K_WAITER}' .. token, b .. '${K_GRANT}' .. token)
end

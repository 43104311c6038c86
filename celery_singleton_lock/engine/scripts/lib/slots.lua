--@include base
-- The slot index of a lock with N slots (limit > 1), beside it in its hash slot, so that no
-- script ever reads the N slots:
--   <base>${K_SLOTS}   a sorted set of slot numbers, each scored by the end of the lease
--                   its slot is believed held for; a free slot scores its own number
--                   (<= ${MAX_LIMIT}, below every lease end in server ms). Numbers are
--                   added in order, 1, 2, 3, ..., as slots are first needed.
--   <base>${K_OWNERS}  a hash: <owner token> -> its slot; ':s<slot>' -> '<owner token>:<group>'
--                   of that slot's holder; ':g<group>' -> the slot that group holds
--                   (tokens and groups never contain ':', so these cannot collide).
-- The slots' values are the truth; the index is a cache. Every script that changes a
-- slot's lease keeps it right; ACQUIRE_SLOTS checks each slot it names against its value
-- and corrects it there. A script that finds no index leaves it to ACQUIRE_SLOTS to
-- rebuild (ZADD XX), so its numbers stay 1 .. ZCARD.

-- slot_key(lock key, base, i) -> the key of slot i (slot 1 is the lock key)
local function slot_key(name, b, i)
  if i == 1 then return name end
  return b .. '${K_SLOT}' .. i
end

-- slot_of(key) -> the base and slot number of a lock key or slot key: '<base>${K_SLOT}<i>'
-- is slot i of the lock with that base; any other key is slot 1 (the lock key) of its own
local function slot_of(key)
  local b, i = string.match(key, '^(.+:)${K_SLOT}([1-9]%d*)$')
  if b then
    local inner = string.match(b, '^{(.*)}:$')
    if (inner and base(inner) == b) or base(string.sub(b, 1, -2)) == b then
      return b, tonumber(i)
    end
  end
  return base(key), 1
end

-- keep_index(base, key TTL ms): the index outlives every slot key: when it has less than
-- that left, it gets twice as much (so a steady lock refreshes it about once a lease)
local function keep_index(b, ttl)
  local index, owners = b .. '${K_SLOTS}', b .. '${K_OWNERS}'
  if redis.call('PTTL', index) < ttl or redis.call('PTTL', owners) < ttl then
    redis.call('PEXPIRE', index, 2 * ttl)
    redis.call('PEXPIRE', owners, 2 * ttl)
  end
end

-- forget(owners key, i, new owner token, its group, drop): the owner entries of slot i's
-- last holder are dropped (unless they are the new owner's), with the fields in drop
local function forget(owners, i, keep_token, keep_group, drop)
  local was = redis.call('HGET', owners, ':s' .. i)
  local old, old_group = string.match(was or '', '^([^:]*):(.*)$')
  if old then
    if old ~= keep_token then drop[#drop + 1] = old end
    if old_group ~= '' and old_group ~= keep_group then drop[#drop + 1] = ':g' .. old_group end
  end
  if #drop > 0 then redis.call('HDEL', owners, unpack(drop)) end
end

-- index_held(base, i, expiry ms, owner token, group ('' none), key TTL ms, create): slot i
-- is held by that owner until expiry. With create, i joins the index if missing (ACQUIRE_SLOTS
-- adds numbers in order); else only an indexed slot is updated.
local function index_held(b, i, expiry, token, group, ttl, create)
  local index, owners = b .. '${K_SLOTS}', b .. '${K_OWNERS}'
  if create then
    redis.call('ZADD', index, expiry, i)
  else
    redis.call('ZADD', index, 'XX', expiry, i)
  end
  forget(owners, i, token, group, {})
  if group ~= '' then
    redis.call('HSET', owners, token, i, ':s' .. i, token .. ':' .. group, ':g' .. group, i)
  else
    redis.call('HSET', owners, token, i, ':s' .. i, token .. ':')
  end
  keep_index(b, ttl)
end

-- index_free(base, i): slot i was released: it scores its own number again, and its
-- holder's entries go
local function index_free(b, i)
  local owners = b .. '${K_OWNERS}'
  redis.call('ZADD', b .. '${K_SLOTS}', 'XX', i, i)
  forget(owners, i, nil, nil, {':s' .. i})
end

-- index_extended(key, expiry ms, key TTL ms): the holder of a lock or slot key extended its
-- lease: the slot's score follows, if the key is a slot of an indexed lock (for a lock
-- without slots there is no index, and nothing is written)
local function index_extended(key, expiry, ttl)
  local b, i = slot_of(key)
  if redis.call('ZADD', b .. '${K_SLOTS}', 'XX', 'CH', expiry, i) == 1 then
    keep_index(b, ttl)
  end
end

-- base(lock key) -> the prefix of its companion keys, as keyspace.base_key builds it:
-- '<name>:' when the name carries a hash tag of its own ('{...}' with something inside),
-- else '{<name>}:'. A companion key is base .. suffix (a suffix of keyspace.SUFFIXES,
-- written in as K_<NAME>), in the lock's Redis Cluster hash slot. (A name with a '}' but
-- no tag never gets here: RedisLock refuses it.)
local function base(name)
  local open = string.find(name, '{', 1, true)
  if open then
    local close = string.find(name, '}', open + 1, true)
    if close and close > open + 1 then return name .. ':' end
  end
  return '{' .. name .. '}:'
end
-- base_of(companion key, its suffix) -> the base it was built from (for a script whose
-- KEYS[1] may be a slot rather than the lock key)
local function base_of(key, suffix)
  return string.sub(key, 1, string.len(key) - string.len(suffix))
end

-- key_ttl(lease ms) -> the Redis TTL of a key leased for that long: it outlives the lease
-- by ${GRACE_BASE_MS} ms and 1/${GRACE_FRACTION} of the lease (protocol.grace_ms), so an
-- abandoned key vanishes by itself (the value, not the TTL, decides "held").
local function key_ttl(lease)
  return lease + ${GRACE_BASE_MS} + math.floor(lease / ${GRACE_FRACTION})
end

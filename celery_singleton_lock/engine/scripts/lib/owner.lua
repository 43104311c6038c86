--@include value
-- owned(value, owner token) -> flag, fencing token, holder info (texts) when the value is
-- ours and held under that owner token (whatever its expiry: a lease that ran out is
-- still its owner's until someone takes it); nil otherwise. The one owner-token check of
-- release, extend, hold and hand-over.
local function owned(v, token)
  local flag, owner, fence, info = fields(v)
  if owner ~= token then return nil end
  return flag, fence, info
end

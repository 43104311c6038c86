-- The lock value, one grammar with engine/value.py (parse_value, format_value):
--   <expiry ms>:<flag>:<owner token>:<fencing token>:<holder info>
-- (flag '1' once a waiter has seen the lock held), or a classic timestamp written by a
-- SETNX locker in another language (seconds or milliseconds, perhaps with a fraction).
-- Numbers are 1 to 16 ASCII digits and at most 2^53 - 1 (exact as a Lua double);
-- anything else at the key is a foreign value.
local MAX_EXACT = ${MAX_EXACT}
local function number(s)
  if string.len(s) > 16 then return nil end
  local n = tonumber(s)
  if n > MAX_EXACT then return nil end
  return n
end
-- parse(value) -> expiry ms | nil (foreign), flag offset | nil (classic), fence, owner token
local function parse(v)
  local digits, rest = string.match(v, '^(%d+)(.*)$')
  if not digits then return nil end
  local n = number(digits)
  if not n then return nil end
  if rest == '' then
    if n < 100000000000 then n = n * 1000 end
    return n, nil, 0, nil
  end
  local frac = string.match(rest, '^%.(%d+)$')
  if frac then
    if string.len(frac) > 16 then return nil end
    local x = tonumber(digits .. '.' .. frac)
    if x < 100000000000 then x = x * 1000 end
    return math.floor(x), nil, 0, nil
  end
  local flag, token, fence = string.match(rest, '^:([01]):([^:]*):(%d+):')
  if not flag then return nil end
  fence = number(fence)
  if not fence then return nil end
  return n, string.len(digits) + 1, fence, token
end
-- fields(value) -> flag, owner token, fencing token, holder info (the texts as stored) of a
-- value in our layout, whatever its expiry; nil for anything else
local function fields(v)
  return string.match(v, '^%d+:([01]):([^:]*):(%d+):(.*)$')
end
-- format_value(expiry ms, flag, owner token, fencing token, holder info) -> the value to
-- write. The one place a value is built. A number is written as an integer; a text (a
-- fencing token read back from a value) as it is.
local function format_value(expiry, flag, token, fence, info)
  if type(expiry) ~= 'string' then expiry = string.format('%.0f', expiry) end
  if type(fence) ~= 'string' then fence = string.format('%.0f', fence) end
  return expiry .. ':' .. flag .. ':' .. token .. ':' .. fence .. ':' .. info
end

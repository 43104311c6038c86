-- STACK_LINE: a call that a stacked limit held back, and that will come back as another
-- delivery (a parked call, a queue-scope call retried with its hold), keeps its place in
-- the line of every limit it does not fit in, under the token it claims with (lib/stack.lua),
-- for keep ms: every take meanwhile leaves room for it, so light calls do not pass it for
-- ever; its next acquire (claiming with that token) takes its place up.
-- KEYS[1] the lock key (it carries the stack's hash tag: the script runs on its node)
-- ARGV[1] the stack spec, ARGV[2] the place token, ARGV[3] keep ms
-- returns the name of the first limit it does not fit in, or '' when it fits now, or its
-- weight is above a limit's number, so it never will (its place is then not taken: it
-- should try again at once, and that acquire refuses it for good)
--@include clock
--@include stack
local now, now_us = clock()
local spec = stack_spec(ARGV[1])
local limit = stack_blocked(spec, ARGV[2], now, now_us, tonumber(ARGV[3]), ARGV[2])
return limit or ''

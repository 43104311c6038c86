-- RELEASE: owner-checked release; hands the lock straight to the first live waiter, else
-- wakes the waiters (lib/release.lua).
-- KEYS[1] lock key (or, with slots, the slot this holder releases), KEYS[2] waiters' queue
-- <base>${K_QUEUE}, KEYS[3] (optional) the done set
-- <base>${K_DONE}, where the run's task id is recorded as finished
-- ARGV[1] owner token, ARGV[2] the number of slots (1: a plain lock; more: the highest
-- token issued across slots is kept in <base>${K_FENCE}), ARGV[3], ARGV[4] (with KEYS[3];
-- '' and 0 without it when a later argument follows) the task id to record in KEYS[3] and
-- how long it is kept (ms), ARGV[5] (optional) fair_after in ms: hand the lock over only to
-- a first waiter that has waited that long, else free it and wake them (0 none), ARGV[6]
-- (optional) '1': the lock has stacked limits (lib/stack.lua)
-- returns 0 not owned (nothing done), 1 released, 2 released and waiters signalled,
--         3 handed over to the first live waiter
--@include release
return release(KEYS[1], KEYS[2], ARGV[1], ARGV[2], KEYS[3], ARGV[3], ARGV[4], tonumber(ARGV[5]),
  ARGV[6] == '1')

"""The lock protocol's timing constants, defined once: the Python protocols read them
here and the Lua scripts get them written in when they are rendered (``${NAME}`` in
:mod:`.scripts`). Imports nothing."""

from __future__ import annotations

__all__ = [
    "FOREIGN_VALUE",
    "GRACE_BASE_MS",
    "GRACE_FRACTION",
    "GRANT_TTL_MS",
    "HELD_WAKE_TTL_MS",
    "MAX_DURATION",
    "MAX_LIMIT",
    "SIGNAL_TTL_MS",
    "SLOT_PROBES",
    "STACK_AHEAD",
    "STARTS_TTL_SLACK_MS",
    "WAITER_SLACK_MS",
]

#: How long a wake-up pushed onto the waiters' signal list survives unread.
SIGNAL_TTL_MS = 2000
#: The key outlives its lease by this much plus a tenth of the lease, so an abandoned key
#: vanishes on its own a little after the lease (the value, not the TTL, decides "held").
GRACE_BASE_MS = 1000
GRACE_FRACTION = 10
#: A queued waiter's place is kept this long past the time it said it would block: a waiter
#: wakes up (and tries again, which renews its place) a little late, never early.
WAITER_SLACK_MS = 500
#: A grant nobody picked up (its waiter died just before) vanishes after this long.
GRANT_TTL_MS = 60_000
#: A wake-up of the workers' sweep of held-back calls survives this long unread (a worker
#: blocked on it reads it at once; with none, the next periodic sweep looks anyway).
HELD_WAKE_TTL_MS = 10_000
#: The starts set of a throttled key (``lock_rate_limit``) outlives its newest start by one
#: window plus this.
STARTS_TTL_SLACK_MS = 1000
#: The longest duration, in seconds, that anything accepts (365 days): a lease, an
#: ``acquire`` wait, and every duration option and setting (``options.MAX_DURATION`` is this
#: one). A lock value's expiry is the server's clock plus the lease in milliseconds and must
#: stay below 2**53 (``value.MAX_EXACT``, the largest integer a Lua number holds exactly);
#: today's clock is about 1.8e12 ms, so the grammar itself would allow leases up to about
#: 285,000 years, but a bound far inside that keeps every sum the scripts make of durations
#: (lease plus grace, a hold after a run, a window plus slack) exact, and refuses a value
#: such as 1e14 s, which is a unit mix-up rather than a wish.
MAX_DURATION = 31_536_000
#: What an acquire says (a LockBackendError, naming the key after it) when the lock key
#: holds a value this library cannot have written (neither its own layout within the
#: grammar nor a classic timestamp) and no TTL: it is never overwritten silently, whoever
#: planted it. Written into the Lua scripts, so no quote characters.
FOREIGN_VALUE = (
    "a value this library cannot have written, with no TTL, is at the lock key; it is "
    "never overwritten silently (remove it with: celery locks clear KEY): "
)
#: The most slots a lock may have (``RedisLock(limit=...)``). An acquire costs the same
#: whatever the limit (the slot index names its candidates in O(log N): one round trip,
#: about a dozen commands, 50-80 us of server time measured at N = 3, 1,000 and 100,000),
#: so the bound is set by what grows with the holders: a full lock of 100,000 slots takes
#: about 55 MB of server memory (some 550 bytes per held slot: its value, its index entry,
#: its owner entries) and ``holders()`` reads them in about 3 s (the Celery side asks for
#: them at every conflict, ``celery locks list`` shows them). Ten times that is half a GB
#: and half a minute per conflict: a limit that large is a mistake, not a wish. The free
#: slots' scores in the index (their own numbers) also stay far below every lease end.
MAX_LIMIT = 100_000
#: How many candidate slots one acquire checks against their values (each one the index
#: named wrongly is corrected) before it reports the lock held: a bound on its work when
#: the index is being rebuilt.
SLOT_PROBES = 16
#: Stacked limits: a take leaves room for the weight of at most this many waiters ahead of it
#: in a limit's line (the first of the line), so a heavy waiter is never passed for ever.
STACK_AHEAD = 16

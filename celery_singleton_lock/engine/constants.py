"""The lock protocol's timing constants, defined once: the Python protocols read them
here and the Lua scripts get them written in when they are rendered (``${NAME}`` in
:mod:`.scripts`). Imports nothing."""

from __future__ import annotations

__all__ = [
    "GRACE_BASE_MS",
    "GRACE_FRACTION",
    "GRANT_TTL_MS",
    "SIGNAL_TTL_MS",
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
#: The starts set of a throttled key (``lock_rate_limit``) outlives its newest start by one
#: window plus this.
STARTS_TTL_SLACK_MS = 1000

"""Head-of-line waits of a contended lock, reconstructed from per-hold instants (pure).

Scenario B of ``benchmarks.bench_lock`` records, for every critical section, three
``CLOCK_MONOTONIC`` instants (one clock for every process of the host):

- ``enq``: when the client's first acquire request of that acquire() call was written to
  its socket (a wrapped redis-py connection stamps it). That request is the one that puts a
  waiter in the lock's queue when the lock is taken (our ACQUIRE script adds the waiter to
  the queue with the server time of that first try as its score), so ordering holds by
  ``enq`` gives the queue order, up to the socket latency between two clients (tens of
  µs);
- ``queued``: when the reply to that first request was read: the server ran it (and so
  queued the client, if it did) somewhere between ``enq`` and ``queued``;
- ``acq``: when acquire() returned;
- ``rel``: just before release() was called.

The holds are disjoint in time (it is one lock) and so are their stamped intervals, which
lie inside them. Two clients whose first requests were in flight at the same time may have
been queued in either order, so the reconstruction gives the lock the benefit of that
doubt: a client ``v`` counts as ahead of ``w`` when it may have queued first (``enq(v) <
queued(w)``) and took the lock before ``w``. A waiter ``w`` becomes *head of the line* when
every client ahead of it has taken the lock: ``head(w) = max(enq(w), max(acq(v) for v ahead
of w))``. Its head wait is ``acq(w) - head(w)``.

The eventual-fairness promise (``fair_after=F``): once the head has waited ``F``, the next
release hands the lock straight to it. Checked per waiter: let ``r*`` be the first release
at or after ``head(w) + F``; the hold that follows ``r*`` must be ``w``'s (or ``w`` already
held the lock by then). A waiter for which some other client's hold came in between is a
*violation*, and ``jumped`` counts how many holds came in between. With FIFO (``F = 0``)
every hand-off must go to the head: the same check then validates the reconstruction
itself (a FIFO lock must show no violations). A client counted as overtaking ``w`` surely
queued after ``w`` (its first request was written after ``w``'s had its reply) or never
queued ahead of it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Hold", "head_waits", "percentile"]


@dataclass(frozen=True)
class Hold:
    """One critical section: first request written, acquire returned, release called, and
    the first request's reply read (ns; 0: not stamped, taken as ``enq``)."""

    enq: int
    acq: int
    rel: int
    queued: int = 0

    @property
    def replied(self) -> int:
        """When the first request's reply was read (``enq`` if not stamped)."""
        return max(self.enq, self.queued)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def head_moments(holds: Sequence[Hold]) -> list[int]:
    """``head(w)`` for each hold, in the order given (see the module docstring)."""
    order = sorted(range(len(holds)), key=lambda i: holds[i].enq)
    enqs = [holds[i].enq for i in order]
    heads = [0] * len(holds)
    for i, hold in enumerate(holds):
        head = hold.enq
        # every v that may have queued before w: first request written before w's reply
        for k in order[: bisect.bisect_left(enqs, hold.replied)]:
            other = holds[k]
            if k != i and head < other.acq < hold.acq:
                head = other.acq
        heads[i] = head
    return heads


def head_waits(holds: Sequence[Hold], fair_ns: int) -> dict[str, Any]:
    """Head waits and the fairness check for ``fair_after`` = ``fair_ns`` (0: FIFO).

    Returns counts, percentiles in ms, the largest head wait beyond ``fair_ns``
    (``over_ms``), violations (waiters another client's hold came in before, after the
    first release at or after ``head + fair_ns``) and the most holds that came in before
    one waiter that way (``jumped_max``).
    """
    if not holds:
        nan = float("nan")
        return {
            "holds": 0,
            "head_p50_ms": nan,
            "head_p99_ms": nan,
            "head_max_ms": nan,
            "over_ms": nan,
            "violations": 0,
            "jumped_max": 0,
        }
    heads = head_moments(holds)
    by_acq = sorted(range(len(holds)), key=lambda i: holds[i].acq)
    rank = {i: k for k, i in enumerate(by_acq)}
    releases = [holds[i].rel for i in by_acq]  # ascending: the holds are disjoint
    waits: list[float] = []
    over = -math.inf
    violations = jumped_max = 0
    for i, hold in enumerate(holds):
        wait = max(0, hold.acq - heads[i])
        waits.append(wait / 1e6)
        over = max(over, (hold.acq - heads[i] - fair_ns) / 1e6)
        due = heads[i] + fair_ns
        if hold.acq <= due:
            continue
        k = bisect.bisect_left(releases, due)  # the hold whose release is r*
        jumped = rank[i] - k - 1  # holds strictly between r* and w's own
        if jumped > 0:
            violations += 1
            jumped_max = max(jumped_max, jumped)
    return {
        "holds": len(holds),
        "head_p50_ms": percentile(waits, 50),
        "head_p99_ms": percentile(waits, 99),
        "head_max_ms": max(waits),
        "over_ms": max(0.0, over),
        "violations": violations,
        "jumped_max": jumped_max,
    }

"""The figures published before the direct hand-off, for the before/after table.

Copied from ``docs/benchmarks.md`` as published at commit 34b423b (lock engine and Celery
runs on that commit, ``--runs 3``, medians), before issue 13's direct hand-off (commit
21b76e9). Each entry: (label, before value, how to read the same figure from a new run,
unit, decimals). The new run reads it with :func:`benchmarks.run.after_value`.
"""

from __future__ import annotations

COMMIT = "34b423b"
MACHINE = "2 CPUs, Intel(R) Xeon(R) Processor @ 2.80GHz, Redis 7.0.15, Python 3.11.7"

#: (label, before, source, field, decimals). ``source``: "lock:<scenario>:<contender>",
#: "lock-paired:<scenario>:<contender>:<reference>" (median of per-run ratios), or
#: "celery:<contender>" / "celery-audit:<contender>" / "celery-cpu:<contender>".
ROWS: tuple[tuple[str, float, str, str, int], ...] = (
    ("A. csl µs per uncontended pair", 314.9, "lock:A:csl", "median_us", 1),
    ("A. csl × floor (paired)", 1.13, "lock:A:csl", "x_floor", 2),
    ("A. csl server commands per pair", 6.00, "lock:A:csl", "commands", 2),
    ("A. csl round trips per pair", 2.00, "lock:A:csl", "round_trips", 2),
    ("B. csl critical sections/s", 1143, "lock:B:csl", "throughput", 0),
    (
        "B. python-redis-lock critical sections/s",
        1102,
        "lock:B:python-redis-lock",
        "throughput",
        0,
    ),
    (
        "B. csl CS/s × python-redis-lock",
        1.01,
        "lock-paired:B:csl:python-redis-lock",
        "throughput",
        2,
    ),
    ("B. csl wait p99 ms", 98.4, "lock:B:csl", "wait_p99_ms", 1),
    (
        "B. csl wait p99 × python-redis-lock",
        0.36,
        "lock-paired:B:csl:python-redis-lock",
        "wait_p99_ms",
        2,
    ),
    ("B. csl commands per critical section", 11.4, "lock:B:csl", "commands", 1),
    ("C. csl hand-off p50 ms", 0.89, "lock:C:csl", "p50_ms", 2),
    ("C. csl hand-off p99 ms", 3.84, "lock:C:csl", "p99_ms", 2),
    ("C. python-redis-lock hand-off p50 ms", 0.82, "lock:C:python-redis-lock", "p50_ms", 2),
    ("C. python-redis-lock hand-off p99 ms", 1.66, "lock:C:python-redis-lock", "p99_ms", 2),
    ("D. csl ms after a killed holder's lease", 2.2, "lock:D:csl", "late_median_ms", 1),
    ("Celery. plain drain tasks/s", 535, "celery:plain", "drain_rate", 0),
    ("Celery. run scope drain × plain", 0.87, "celery:csl-run", "ratio", 2),
    ("Celery. queue scope drain × plain", 0.79, "celery:csl-queue", "ratio", 2),
    (
        "Celery. run scope lock round trips per task in the worker",
        2.00,
        "celery-audit:csl-run",
        "drain_rt",
        2,
    ),
    (
        "Celery. queue scope lock round trips per task in the worker",
        2.00,
        "celery-audit:csl-queue",
        "drain_rt",
        2,
    ),
    (
        "Celery. queue scope lock round trips per publish",
        1.00,
        "celery-audit:csl-queue",
        "publish_rt",
        2,
    ),
    ("Celery. queue scope publishes/s", 588, "celery:csl-queue", "publish_rate", 0),
    (
        "Celery. celery-singleton publishes/s",
        795,
        "celery:celery-singleton",
        "publish_rate",
        0,
    ),
    (
        "Celery. queue scope producer CPU µs per publish",
        1318,
        "celery-cpu:csl-queue",
        "producer",
        0,
    ),
    (
        "Celery. celery-singleton producer CPU µs per publish",
        1069,
        "celery-cpu:celery-singleton",
        "producer",
        0,
    ),
)

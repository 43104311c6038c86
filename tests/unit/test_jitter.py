"""Retry jitter spreads retries without touching the application's global ``random``."""

from __future__ import annotations

import random

from celery_singleton_lock.modes.policies import jitter


def test_jitter_stays_within_a_quarter_and_leaves_the_global_random_alone() -> None:
    """Up to a quarter more than asked; an application that seeded ``random`` draws the
    same numbers whether or not locks jittered meanwhile."""
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    draws = [jitter(2.0) for _ in range(200)]
    assert all(2.0 <= d <= 2.5 for d in draws)
    assert len(set(draws)) > 150  # spread, not one value
    assert [random.random() for _ in range(3)] == expected

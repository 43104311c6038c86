"""The global-ID example: gapless numbers from real workers, and a stale holder fenced off."""

from __future__ import annotations

import pytest

from tests.examples.conftest import run_example

pytestmark = pytest.mark.slow


def test_invoice_numbers_are_gapless_and_the_stale_write_is_refused() -> None:
    """Two tenants × 5 invoices: each gets exactly 1..N, and the stalled holder's late
    write is refused by the database because a later fencing token claimed the tenant."""
    done = run_example("examples.global_id.run", "--tenants", "2", "--invoices", "5", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tenant-a: 1 2 3 4 5 6" in done.stdout
    assert "tenant-b: 1 2 3 4 5" in done.stdout
    assert "the stalled write was REFUSED by the database" in done.stdout
    assert "FAILED" not in done.stdout
    assert "all checks passed" in done.stdout

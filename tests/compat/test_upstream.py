"""celery-singleton's and celery-once's own public tests pass against the shims.

Collected only when ``CSL_UPSTREAM_SINGLETON`` / ``CSL_UPSTREAM_ONCE`` name a checkout of
that project (see ``conftest.py``); each runs ``scripts/upstream_tests/run.py``, which
exports the pinned commit's tests outside this repository and runs the public ones with
the test-run-only aliases. Nothing of those projects is kept in this repository.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.compat.conftest import ROOT

pytestmark = pytest.mark.slow

PROJECTS = [
    pytest.param(option, variable, id=option)
    for option, variable in (("singleton", "CSL_UPSTREAM_SINGLETON"), ("once", "CSL_UPSTREAM_ONCE"))
    if os.environ.get(variable)
]


@pytest.mark.parametrize(("option", "variable"), PROJECTS)
def test_upstream_public_tests_pass(option: str, variable: str) -> None:
    """Every public test of the upstream project passes against our shim, and every
    upstream test is classified (public, internal with a reason, or Python 2 only)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "upstream_tests" / "run.py"),
         f"--{option}", os.environ[variable]],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "public tests passed against the shim" in done.stdout

"""The pytest-celery container example (examples/pytest_celery) imports and collects
without a Docker engine, and its Dockerfile copies only what exists."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pytest_celery"

pytestmark = pytest.mark.slow


def test_container_example_imports_and_collects_without_docker() -> None:
    """Its conftest declares pytest-celery's container fixtures without touching Docker,
    and pytest collects both of its tests."""
    conftest = importlib.import_module("examples.pytest_celery.conftest")
    assert conftest.LockedWorkerContainer.tasks_modules() == {
        importlib.import_module("examples.pytest_celery.tasks")
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "examples/pytest_celery"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("test_a_duplicate_is_skipped_while_the_first_runs",
                 "test_other_reports_run_side_by_side"):  # fmt: skip
        assert f"test_locked_tasks.py::{name}" in done.stdout


def test_container_example_dockerfile_copies_existing_paths() -> None:
    """Every COPY source of the worker image exists at the repository root (its build
    context), and the image installs this package from it."""
    text = (EXAMPLE / "Dockerfile").read_text(encoding="utf-8")
    sources = [
        part for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE)
        for part in line.split()[:-1]
    ]  # fmt: skip
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
    assert re.search(r'^RUN pip install "\."', text, re.MULTILINE)

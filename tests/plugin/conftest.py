"""Helpers of the pytest-plugin tests: each writes a small test suite into a temporary
directory and runs pytest on it in a subprocess, as a user's suite would run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

RunSuite = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def run_suite(tmp_path: Path) -> RunSuite:
    """Write ``files`` (name -> text) under a fresh directory and run pytest there."""

    def run(files: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        for name, text in files.items():
            (tmp_path / name).write_text(text, encoding="utf-8")
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=400, check=False,
        )  # fmt: skip

    return run

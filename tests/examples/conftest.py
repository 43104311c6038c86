"""Run the examples as a user would: ``python -m examples....`` in a subprocess, bounded.

The examples start their own private redis-server and workers; ``REDIS_URL`` is removed
from their environment so they never touch a Redis of the developer's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def example_env() -> dict[str, str]:
    """Our environment without REDIS_URL, the repo on PYTHONPATH, a wide terminal."""
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "120"
    return env


def run_example(module: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` to completion (at most ``timeout`` s)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=example_env(), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def started_pids(output: str) -> list[int]:
    """The PIDs an example reported starting (``started … pid N``)."""
    return [int(pid) for pid in re.findall(r"^started .*? pid (\d+)", output, re.MULTILINE)]

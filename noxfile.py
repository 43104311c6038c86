"""The version matrix: the lock engine and the real-worker tests on the oldest supported
Celery / kombu / redis-py and on one set in the middle of the range.

The newest versions run the whole suite in the project's own venv (``make test``); these
sessions each build a venv of their own. ``make test`` runs them; by hand::

    .venv/bin/nox -s "matrix(oldest)"       # or "matrix(middle)", or -s matrix for both
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def interpreter(version: str) -> str:
    """``python<version>`` from PATH when it runs, else pyenv's build of it (pyenv's shims
    only answer for the versions selected as global), else the bare name for nox to report."""
    name = f"python{version}"
    found = shutil.which(name)
    if found and subprocess.run([found, "-V"], capture_output=True, check=False).returncode == 0:
        return found
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    builds = sorted(glob.glob(f"{root}/versions/{version}.*/bin/{name}"))
    return builds[-1] if builds else name


#: The pinned runtime dependencies of each set. "oldest" is exactly the floor that
#: pyproject.toml declares; keep the two in step.
OLDEST = ["celery==5.3.6", "kombu[redis]==5.3.4", "redis==5.0.1", "click==8.1.2"]
MIDDLE = ["celery==5.6.3", "kombu[redis]==5.6.2", "redis==6.4.0"]
#: What runs on every set: the engine (pure and on a real redis-server), real workers, and
#: the celery-singleton / celery-once shims (about 35 s), the pytest plugin beside Celery's
#: in-process fixtures and pytest-celery (about 20 s), and the cheap part of the modes (option
#: combinations, workers refusing them, the scripts' round trips: about 5 s).
MATRIX_TESTS = [
    "tests/unit", "tests/lock", "tests/worker", "tests/compat", "tests/plugin",
    "tests/modes/test_combinations.py", "tests/modes/test_round_trips.py",
    "tests/modes/test_fake_policies.py", "tests/modes/test_fake_modes.py",
    "tests/modes/test_worker_round_trips.py",
]  # fmt: skip


@nox.session
@nox.parametrize(
    ("python", "pins"),
    [(interpreter("3.10"), OLDEST), (interpreter("3.12"), MIDDLE)],
    ids=["oldest", "middle"],
)
def matrix(session: nox.Session, pins: list[str]) -> None:
    """Engine and real-worker tests on one pinned set of Celery / kombu / redis-py."""
    # The pins go in with the project so the resolver cannot move them.
    session.install(".[test]", *pins)
    session.run("python", "-m", "pip", "list", "--format=freeze")
    # Spread over two processes (the tests mostly wait on workers); the "alone" tests (CPU-
    # and timing-bound load tests, nothing version-specific) run once, on the newest set.
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                "-m", "not alone", *MATRIX_TESTS, *session.posargs)  # fmt: skip

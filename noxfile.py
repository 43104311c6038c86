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
#: What runs on every set: the engine (pure and on a real redis-server) and real workers.
MATRIX_TESTS = ["tests/unit", "tests/lock", "tests/worker"]


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
    session.run("pytest", "-q", "-p", "no:cacheprovider", *MATRIX_TESTS, *session.posargs)

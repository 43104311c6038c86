"""The code a soak's processes run, pinned for the whole soak and checked.

A soak restarts workers and beat replicas for minutes. Started from the working tree
(``PYTHONPATH`` and ``cwd`` the checkout, as the package is installed editable), a
process restarted mid-soak imports whatever the tree holds at that moment: an edit made
meanwhile (a file changed to see a test fail, then put back) runs in that one process
beside processes that run the code the soak began with, and its misbehaviour is judged
as the package's. So the driver copies the packages the processes import into a
snapshot as the soak begins (:func:`snapshot`) and starts every process from it; each
process reports what it imported (:func:`imported`, written to the ledger as the app is
imported) and the soak fails when a process ran other code (:func:`other_code`).

Run as ``python -m benchmarks.soak.code``, it prints :func:`imported` as JSON.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_singleton_lock.engine.scripts import SCRIPTS

__all__ = [
    "PACKAGES",
    "Code",
    "digest",
    "imported",
    "other_code",
    "run_imported",
    "scripts_digest",
    "snapshot",
]

#: The top-level packages a soak process imports (the app imports ``tests.invariants``).
PACKAGES = ("celery_singleton_lock", "benchmarks", "tests")
#: Not code: left out of the snapshot and of the digest.
_IGNORED = ("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")


@dataclass(frozen=True)
class Code:
    """A snapshot of the code: the directory the packages were copied to, the digest of
    their files, the digest of the engine's Lua scripts as they render there, and the
    revision of the tree they were copied from (``git describe``, with ``-dirty`` for
    uncommitted changes; None outside a checkout)."""

    root: Path
    digest: str
    scripts: str
    revision: str | None = None

    def env(self) -> dict[str, str]:
        """The environment a soak process gets: it imports the snapshot first, and knows
        the digest it should find there."""
        return {"PYTHONPATH": str(self.root), "CSL_SOAK_CODE": self.digest}

    def as_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "digest": self.digest,
            "scripts": self.scripts,
            "revision": self.revision,
        }


def _files(root: Path, packages: Sequence[str]) -> list[Path]:
    found = []
    for package in packages:
        for path in (root / package).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and not any(
                part in _IGNORED or part.endswith(".pyc") for part in relative.parts
            ):
                found.append(relative)
    return sorted(found)


def digest(root: Path, packages: Sequence[str] = PACKAGES) -> str:
    """The SHA-256 of the packages' files under ``root`` (their paths and contents)."""
    sha = hashlib.sha256()
    for relative in _files(root, packages):
        sha.update(relative.as_posix().encode() + b"\0")
        sha.update((root / relative).read_bytes() + b"\0")
    return sha.hexdigest()


def scripts_digest() -> str:
    """The SHA-256 of the engine's Lua scripts as this process rendered them at import
    (their names and SHA-1s: what it runs on the lock Redis)."""
    text = "".join(f"{name}:{script.sha}\n" for name, script in sorted(SCRIPTS.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _revision(source: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=source, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return done.stdout.strip() or None


def snapshot(source: Path, dest: Path) -> Code:
    """Copy the packages from the tree at ``source`` to ``dest`` (which must not exist
    yet) and describe the copy, as a process started from it (:meth:`Code.env`, ``cwd``
    ``dest``) reports it. ``RuntimeError`` when the tree changed while it was copied, or
    when such a process does not import the copy."""
    dest.mkdir(parents=True)
    dest = dest.resolve()
    for package in PACKAGES:
        shutil.copytree(source / package, dest / package, ignore=shutil.ignore_patterns(*_IGNORED))
    copied = digest(dest)
    if digest(source) != copied:
        raise RuntimeError(f"the tree at {source} changed while the soak copied it")
    code = Code(dest, copied, "", _revision(source))
    found = run_imported(code)
    if found["root"] != str(dest) or found["digest"] != copied:
        raise RuntimeError(f"a process started from the snapshot {dest} imported {found['root']}")
    return Code(dest, copied, str(found["scripts"]), code.revision)


def run_imported(code: Code) -> dict[str, Any]:
    """:func:`imported` as a process started like a soak's (``python -m``, from ``cwd``
    ``code.root`` with :meth:`Code.env`) reports it."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak.code"], cwd=code.root,
        env={**os.environ, **code.env()}, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def imported() -> dict[str, Any]:
    """What this process imported: the directory each package came from (one, when
    started from a snapshot), the digest of that tree, and :func:`scripts_digest`."""
    roots = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        roots.add(str(Path(str(module.__file__)).resolve().parents[1]))
    root = next(iter(roots)) if len(roots) == 1 else None
    return {
        "root": root if root is not None else sorted(roots),
        "digest": digest(Path(root)) if root is not None else None,
        "scripts": scripts_digest(),
    }


def other_code(reports: Mapping[str, Mapping[str, Any]], code: Mapping[str, Any]) -> list[str]:
    """The processes (as they reported themselves: ``"<label>:<pid>"``) that ran other
    code than the snapshot ``code`` (:meth:`Code.as_json`): imported from elsewhere, from
    a tree with another digest, or with other Lua scripts."""
    return sorted(
        name
        for name, found in reports.items()
        if found.get("root") != code["root"]
        or found.get("digest") != code["digest"]
        or found.get("scripts") != code["scripts"]
    )


if __name__ == "__main__":
    print(json.dumps(imported()))

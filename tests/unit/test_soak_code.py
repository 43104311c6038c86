"""The chaos soak runs every worker and beat replica from one snapshot of the code
(``benchmarks.soak.code``), and fails when a process ran other code.

A 2-minute soak once reported 6 beat slots sent twice: a beat replica restarted by the
soak mid-run imported the working tree while ``beat_claim.lua`` and the scheduler were
being edited there (a check that a test fails without the lease check), and led on that
code beside replicas running the committed code. These tests copy the tree and edit the
copy, never the tree itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.soak.analysis import analyse, code_figures
from benchmarks.soak.code import Code, digest, other_code, run_imported, snapshot
from benchmarks.soak.ledger import Snapshot
from benchmarks.soak.rig import ROOT, Rig
from celery_singleton_lock.testing import RedisServer


def imported_by(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """What a process started as the soak starts one (``python -m``, ``env`` laid over
    this environment, in ``cwd``) reports it imported."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak.code"], cwd=cwd, env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_a_process_restarted_after_an_edit_still_runs_the_snapshot(tmp_path: Path) -> None:
    """The soak's rig starts its processes from the snapshot: one started after the tree
    was edited reports the snapshot's files and Lua scripts, not the edit. Started from
    the tree itself (``PYTHONPATH`` and ``cwd``, as the rig did before), it runs the edit,
    and the soak's check names it."""
    tree = snapshot(ROOT, tmp_path / "tree").root  # a copy of the checkout, to edit
    code = snapshot(tree, tmp_path / "code")
    rig = Rig(
        RedisServer(), RedisServer(), RedisServer(), [], tmp_path, 3.0, {}, code
    )  # not started: only its launch settings are used
    claim = tree / "celery_singleton_lock" / "engine" / "scripts" / "beat_claim.lua"
    claim.write_text(claim.read_text(encoding="utf-8") + "-- edited\n", encoding="utf-8")

    restarted = imported_by(rig.env("beat0", rig.lock.url), rig.cwd)
    assert restarted == {"root": str(code.root), "digest": code.digest, "scripts": code.scripts}
    from_tree = imported_by({"PYTHONPATH": str(tree)}, tree)
    assert from_tree["root"] == str(tree)
    assert from_tree["scripts"] != code.scripts
    assert from_tree["digest"] == digest(tree) != code.digest
    reports = {"beat0:1": restarted, "beat2:2": from_tree}
    assert other_code(reports, code.as_json()) == ["beat2:2"]


def test_the_snapshot_is_what_a_process_started_from_it_imports(tmp_path: Path) -> None:
    """``snapshot`` checks that a process started from the copy imports the copy, and
    records the Lua scripts it renders there."""
    code = snapshot(ROOT, tmp_path / "code")
    assert code.root == (tmp_path / "code").resolve()
    assert run_imported(code) == {
        "root": str(code.root),
        "digest": code.digest,
        "scripts": code.scripts,
    }
    assert code.env() == {"PYTHONPATH": str(code.root), "CSL_SOAK_CODE": code.digest}


def test_a_process_that_ran_other_code_fails_the_soak() -> None:
    """Another root, another digest or other Lua scripts: the process is named, and the
    soak misses a safety target (its other verdicts judged a mixture of versions)."""
    code = Code(Path("/snap"), "d" * 64, "s" * 64, "abc123").as_json()
    same = {"root": "/snap", "digest": "d" * 64, "scripts": "s" * 64}
    reports = {
        "w1:10": same,
        "beat0:11": same,
        "beat2:12": {**same, "scripts": "x" * 64},
        "w2:13": {**same, "root": "/work/tree"},
        "w3:14": {**same, "digest": "e" * 64},
    }
    figures = code_figures(code, reports, started=6)
    assert figures["other_code"] == ["beat2:12", "w2:13", "w3:14"]
    assert (figures["processes_started"], figures["processes_reported"]) == (6, 5)
    failed = analyse(Snapshot(), [], lease=3.0, lock_commands=0, code=figures)
    assert not failed.safe
    (row,) = [row for row in failed.targets if row["name"].startswith("soak processes")]
    assert (row["value"], row["met"], row["safety"]) == (3, False, True)
    clean = code_figures(code, {"w1:10": same, "beat0:11": same}, started=2)
    assert analyse(Snapshot(), [], lease=3.0, lock_commands=0, code=clean).safe

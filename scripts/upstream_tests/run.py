"""Run celery-singleton's and celery-once's own public tests against our compat shims.

Nothing of theirs is in this repository: point this script at a git checkout (a working
tree or a bare/mirror git directory) of each project. It exports that project's ``tests/``
at the pinned commit into a temporary directory, checks that every test function there is
classified below (public: run; internal: not run, with the reason; Python 2 only), starts a
private redis-server (and, for celery-once's Flask test, a real ``celery worker``), and runs
the public tests with ``csl_upstream_alias`` loaded, so that ``import celery_singleton`` and
``import celery_once`` resolve to our shims in that run only::

    .venv/bin/python scripts/upstream_tests/run.py --singleton ~/src/celery-singleton \
        --once ~/src/celery-once

or with ``CSL_UPSTREAM_SINGLETON`` / ``CSL_UPSTREAM_ONCE`` set. celery-once's public test
imports Flask: have it importable (``pip install flask``, or a directory of it on
``PYTHONPATH``). Exit status 0 when every public test of every project given passed, 1 when
one failed, 2 when the checkout does not match the tables below.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from celery_singleton_lock.testing import CeleryWorker, RedisServer

HERE = Path(__file__).resolve().parent

#: How long one project's pytest run may take (seconds).
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Project:
    """One upstream project: where its tests come from and how each is classified."""

    name: str
    version: str
    commit: str
    env: str
    public: tuple[str, ...]
    #: Node-id prefix -> why the tests under it are internal (first matching prefix wins).
    internal: tuple[tuple[str, str], ...]
    py2_only: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    flask_worker: bool = False

    def reason(self, test_id: str) -> str | None:
        """Why ``test_id`` is internal, or None when it is not listed as internal."""
        return next((why for prefix, why in self.internal if test_id.startswith(prefix)), None)


_S = "tests/test_singleton.py::"
SINGLETON = Project(
    name="celery-singleton",
    version="0.3.1",
    commit="b33452989fa98ce764a9b8cd35573c2ec7c2de6a",
    env="CSL_UPSTREAM_SINGLETON",
    public=(
        _S + "TestSimpleTask::test__queue_duplicates__same_id",
        _S + "TestSimpleTask::test__queue_multiple_uniques__different_ids",
        _S + "TestSimpleTask::test__queue_duplicate_after_success__different_ids",
        _S + "TestSimpleTask::test__queue_duplicate_after_error__different_ids",
        _S + "TestSimpleTask::test__apply_async_fails__exception_reraised",
        _S + "TestSimpleTask::test__raise_on_duplicate__raises_duplicate_error",
    ),
    internal=(
        (
            _S + "TestSimpleTask::test__get_existing_task_id",
            "calls the private generate_lock / aquire_lock / get_existing_task_id methods",
        ),
        (
            _S + "TestSimpleTask::test__apply_async_fails__lock_cleared",
            "finds the lock through the private generate_lock / get_existing_task_id "
            "(the behaviour is ours to test: test_publish_error_frees_the_lock)",
        ),
        (
            _S + "TestClearLocks::",
            "reads the private singleton_backend / singleton_config objects (the behaviour "
            "is ours to test: test_clear_locks_removes_only_locks_under_the_prefix)",
        ),
        (
            _S + "TestUniqueOn::",
            "mocks the private util.generate_lock and asserts its arguments, i.e. the old "
            "key format (behaviour: test_unique_on_*)",
        ),
        (
            _S + "TestRaiseOnDuplicateConfig::",
            "reads the private _raise_on_duplicate property and singleton_config "
            "(behaviour: test_raise_on_duplicate_*)",
        ),
        (
            _S + "TestLockExpiry::",
            "mocks the private RedisBackend.lock (behaviour: test_lock_expiry_*)",
        ),
        (
            "tests/test_config.py::",
            "the private Config class (settings behaviour: test_settings_*, test_backend_*)",
        ),
        (
            "tests/test_backends.py::",
            "the private storage layer (RedisBackend, get_backend and its process-wide cache)",
        ),
    ),
    plugins=("celery.contrib.pytest",),
)

ONCE = Project(
    name="celery-once",
    version="3.0.1",
    commit="0ee16d44525a121616554ae02fd2abddfe5a87e8",
    env="CSL_UPSTREAM_ONCE",
    public=("tests/integration/flask_app/test_flask.py::test_flask",),
    internal=(
        (
            "tests/integration/test_tasks.py::",
            "replaces the backend by a mock class imported from a dotted path "
            "(tests.backends.TestBackend) and asserts calls on it, or reads the private "
            "config / once_config / once_backend properties (behaviour: tests/compat/"
            "test_once.py)",
        ),
        (
            "tests/integration/backends/test_redis.py::",
            "patches fakeredis into the private backend and reads the old key format "
            "qo_<task>_<arg>-<value> (behaviour: test_once_*)",
        ),
        (
            "tests/integration/backends/test_file.py::",
            "celery-once's file backend, which is refused (see docs/migration.md)",
        ),
        ("tests/unit/backends/test_file.py::", "celery-once's file backend"),
        (
            "tests/unit/backends/test_redis.py::",
            "the private URL parser and Redis backend, with mocked clients (URL forms: "
            "test_once_url_forms)",
        ),
        ("tests/unit/test_helpers.py::", "the private key-building and import helpers"),
        (
            "tests/unit/test_tasks.py::",
            "the private get_key / _get_call_args and the old key format; the module also "
            "imports celery.task, gone since Celery 5",
        ),
    ),
    py2_only=(
        "tests/unit/test_helpers.py::test_kwargs_to_list_5",
        "tests/unit/test_helpers.py::test_queue_once_key_unicode_py2",
    ),
    flask_worker=True,
)

PROJECTS = {"singleton": SINGLETON, "once": ONCE}


def git_dir(path: Path) -> Path | None:
    """The git directory of a working tree or a bare/mirror repository, else None."""
    for candidate in (path / ".git", path):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def export_tests(source: Path, commit: str, dest: Path) -> str:
    """Put ``tests/`` of ``source`` at ``commit`` into ``dest``; returns what was exported."""
    repo = git_dir(source)
    if repo is None:
        shutil.copytree(source / "tests", dest / "tests")
        return f"{source}/tests (not a git checkout: commit not verified)"
    archive = subprocess.run(
        ["git", f"--git-dir={repo}", "archive", commit, "tests"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    return f"{repo} at {commit}"


def test_ids(root: Path) -> list[str]:
    """Every test function of ``root/tests`` as a pytest node id (module functions and
    methods of ``Test*`` classes), found by reading the files, not by importing them."""
    found: list[str] = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        relative = path.relative_to(root).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                found.append(f"{relative}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                found.extend(
                    f"{relative}::{node.name}::{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name.startswith("test")
                )
    return found


def classify(project: Project, ids: list[str]) -> dict[str, list[str]] | str:
    """``{"public": [...], "internal": [...], "py2_only": [...]}``, or what does not match."""
    unknown = [
        test
        for test in ids
        if test not in project.public
        and test not in project.py2_only
        and project.reason(test) is None
    ]
    missing = [test for test in (*project.public, *project.py2_only) if test not in ids]
    if unknown or missing:
        return f"unclassified: {unknown}; expected but absent: {missing}"
    return {
        "public": [test for test in ids if test in project.public],
        "internal": [
            test for test in ids if test not in project.public and test not in project.py2_only
        ],
        "py2_only": [test for test in ids if test in project.py2_only],
    }


def _pythonpath(*entries: Path) -> str:
    return os.pathsep.join([*(str(entry) for entry in entries), os.environ.get("PYTHONPATH", "")])


def outcomes(junit: Path) -> dict[str, str]:
    """``{test name: passed | failed | error | skipped}`` from a JUnit XML report."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - our own report
        name = case.get("name", "?")
        state = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                state = {"failure": "failed"}.get(tag, tag)
        result[name] = state
    return result


def run_project(project: Project, source: Path, keep: bool) -> int:
    """Export, check, run; print the summary; return 0 (all public passed), 1 or 2."""
    work = Path(tempfile.mkdtemp(prefix=f"csl-upstream-{project.name}-"))
    try:
        origin = export_tests(source, project.commit, work)
        classes = classify(project, test_ids(work))
        print(f"== {project.name} {project.version}: tests from {origin}")
        if isinstance(classes, str):
            print(f"   the checkout does not match this script's tables: {classes}")
            return 2
        (work / "pytest.ini").write_text(
            "[pytest]\nmarkers =\n    framework: celery-once's tests that need a running worker\n",
            encoding="utf-8",
        )
        with RedisServer() as server:
            env = {
                **os.environ,
                "PYTHONPATH": _pythonpath(work, HERE),
                "CELERY_SINGLETON_TEST_REDIS_URL": server.url,
                "REDIS_URL": server.url.removesuffix("/0"),
            }
            worker = None
            if project.flask_worker:
                worker = CeleryWorker(
                    "csl_upstream_flask_worker", pool="prefork", concurrency=2, env=env,
                    cwd=work, log_path=work / "worker.log", ready_timeout=60,
                )  # fmt: skip
                worker.start()
            try:
                junit = work / "report.xml"
                command = [
                    sys.executable, "-m", "pytest", "-c", str(work / "pytest.ini"),
                    "--rootdir", str(work), "-p", "no:cacheprovider", "-p", "csl_upstream_alias",
                    *(arg for plugin in project.plugins for arg in ("-p", plugin)),
                    "-q", "-rA", f"--junitxml={junit}", *classes["public"],
                ]  # fmt: skip
                done = subprocess.run(command, cwd=work, env=env, timeout=RUN_TIMEOUT, check=False)
            finally:
                if worker is not None:
                    worker.stop()
        results = outcomes(junit) if junit.exists() else {}
        passed = [
            test for test in classes["public"] if results.get(test.rsplit("::", 1)[1]) == "passed"
        ]
        print(
            f"== {project.name} {project.version} ({project.commit[:7]}): "
            f"{len(passed)} of {len(classes['public'])} public tests passed against the shim "
            f"(pytest exit {done.returncode}); {len(classes['internal'])} internal tests not "
            f"run; {len(classes['py2_only'])} Python-2-only tests not run"
        )
        for test in classes["internal"]:
            print(f"   internal, not run: {test} — {project.reason(test)}")
        for test in classes["py2_only"]:
            print(f"   Python 2 only, not run: {test}")
        return 0 if len(passed) == len(classes["public"]) and done.returncode == 0 else 1
    finally:
        if keep:
            print(f"   kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run the projects given on the command line or in the environment."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, project in PROJECTS.items():
        parser.add_argument(
            f"--{key}", type=Path, default=os.environ.get(project.env) or None,
            help=f"checkout of {project.name} (default: ${project.env})",
        )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = parser.parse_args(argv)
    chosen = [(project, getattr(args, key)) for key, project in PROJECTS.items()]
    chosen = [(project, path) for project, path in chosen if path is not None]
    if not chosen:
        parser.error("give --singleton and/or --once (or set CSL_UPSTREAM_SINGLETON / _ONCE)")
    return max(run_project(project, Path(path), args.keep) for project, path in chosen)


if __name__ == "__main__":
    sys.exit(main())

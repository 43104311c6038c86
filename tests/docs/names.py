"""Resolve the names the documentation writes in backticks against the code.

:func:`backticked` collects every inline code span of README.md, docs/*.md and CHANGELOG.md
(code blocks are left to ``test_readme.py``, which runs them). :class:`Resolver` sorts a
span into the kind of name it looks like and looks it up where that kind is defined:

- a dotted Python name (``celery_singleton_lock.modes.COMBINATIONS``, ``options.X``,
  ``RedisLock.ensure_held()``, ``redis.lock.Lock``): imported and walked with ``getattr``,
  the keyword arguments of a call (``RedisLock(fair_after=T)``) checked against the
  signature;
- a task option ``lock_*`` (the option table of options.py, or a signal, or an attribute
  of ``LockedTask`` or of a compat shim);
- a setting ``singleton_lock_*`` / ``singleton_beat_*`` and its Django spelling
  ``CELERY_SINGLETON_LOCK_*`` (the option table; the pytest plugin's fixtures and ini name
  and the message headers share the prefix), or a compat setting (``singleton_*``);
- a worker event ``task-lock-*`` (``_observe``) or Celery's own ``task-*`` events;
- a signal ``lock_*`` (``celery_singleton_lock.signals``);
- a Prometheus metric ``celery_singleton_lock_*`` with its labels (``metrics``);
- a ``celery locks ...`` command line: every sub-command and option of the click group;
- an upper-case word: a Lua script (``engine.scripts``), a Redis command (the server's
  ``COMMAND LIST``), a Celery state, a constant of the package, a column or line heading
  the CLI prints, an environment variable the repository reads;
- a companion-key form (``<base>queue``, ``<key>:parked``, ``<prefix>:{<prefix>:stack}:limits``):
  each suffix of ``engine.keyspace`` and ``engine.stack``;
- a path (``engine/value.py``, ``tests/lock/test_stack.py``): a file or folder of the
  repository.

Anything else (prose in backticks, values, shell words) is not a name and is left alone.
A span of a known kind that does not resolve is reported with the reason.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "celery_singleton_lock"
#: The pages whose spans are claims: the README, every page of the site, the CHANGELOG.
PAGES = (
    "README.md",
    "CHANGELOG.md",
    *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")),
)

#: Packages of the ``bench`` extra, which the test environment may not have: a name under
#: them is resolved when the package is importable and otherwise left alone.
BENCH_ONLY = frozenset(("celery_once", "celery_singleton", "redis_lock", "pottery"))
#: Celery's task event types (``celery.events``; Flower and ``app.events.Receiver`` see them).
CELERY_EVENTS = frozenset((
    "task-sent", "task-received", "task-started", "task-succeeded", "task-failed",
    "task-rejected", "task-revoked", "task-retried",
))  # fmt: skip
#: The error codes a Redis server replies with (the first word of an error reply).
REDIS_ERRORS = frozenset((
    "ASK", "BUSY", "CLUSTERDOWN", "CROSSSLOT", "EXECABORT", "LOADING", "MASTERDOWN", "MOVED",
    "NOAUTH", "NOPERM", "NOSCRIPT", "OOM", "READONLY", "TRYAGAIN", "WRONGPASS", "WRONGTYPE",
))  # fmt: skip
#: Where a bare CamelCase name from outside the package may come from.
THIRD_PARTY = (
    "celery", "celery.exceptions", "celery.app.task", "celery.signals", "celery.result",
    "celery.utils.dispatch", "celery.contrib.testing.worker", "celery.contrib.abortable",
    "redis", "redis.exceptions", "redis.cluster", "redis.lock", "redis.client",
    "redis.connection", "redis.asyncio", "kombu", "billiard.exceptions", "datetime",
    "decimal", "uuid", "enum", "pathlib", "asyncio", "threading", "dataclasses",
    "celery.beat", "django_celery_beat.schedulers",
)  # fmt: skip
#: Variables the docs use for objects of a known type: ``task.lock_key(...)``.
ALIASES = {
    "task": ("celery_singleton_lock", "LockedTask"),
    "self": ("celery_singleton_lock", "LockedTask"),
    "current_lock()": ("celery_singleton_lock", "RedisLock"),
    "request": ("celery.app.task", "Context"),
    "app": ("celery", "Celery"),
}

#: An inline code span, which may go on over a line break (not over a blank line).
_SPAN = re.compile(r"(?<!`)`((?:[^`\n]|\n(?![ \t]*\n))+)`(?!`)")
_FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"(?:{_IDENT}(?:\(\))?)(?:\.{_IDENT}(?:\(\))?)+")
_CALL = re.compile(rf"({_IDENT}(?:\.{_IDENT})*)\((.*)\)")
_PATH_EXT = (".py", ".md", ".lua", ".json", ".yml", ".yaml", ".toml", ".sh", ".png", ".cfg", ".txt")


@dataclass(frozen=True)
class Span:
    """One inline code span: the page, its line and its text."""

    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: `{self.text}`"


def backticked(pages: Iterable[str] = PAGES) -> Iterator[Span]:
    """Every inline code span of ``pages`` outside fenced code blocks."""
    for page in pages:
        text = (ROOT / page).read_text(encoding="utf-8")
        blanked = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in _SPAN.finditer(blanked):
            line = blanked.count("\n", 0, match.start()) + 1
            yield Span(page, line, " ".join(match.group(1).split()))


# --------------------------------------------------------------------------- what exists


def _package_modules() -> list[ModuleType]:
    """Every module of the package, imported."""
    names = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return [importlib.import_module(name) for name in names]


def _importable(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class Known:
    """The names the code defines, each kind computed once."""

    @cached_property
    def modules(self) -> list[ModuleType]:
        return _package_modules()

    @cached_property
    def module_names(self) -> set[str]:
        return {module.__name__ for module in self.modules}

    @cached_property
    def defined(self) -> dict[str, list[Any]]:
        """Every top-level name of a package module (its own or imported), to its objects."""
        found: dict[str, list[Any]] = {}
        for module in self.modules:
            for name, value in vars(module).items():
                found.setdefault(name, []).append(value)
        return found

    @cached_property
    def options(self) -> set[str]:
        from celery_singleton_lock.options import task_option_names  # noqa: PLC0415

        return set(task_option_names())

    @cached_property
    def settings(self) -> set[str]:
        from celery_singleton_lock.beat.config import setting_names as beat_names  # noqa: PLC0415
        from celery_singleton_lock.options import setting_names  # noqa: PLC0415

        return set(setting_names()) | set(beat_names())

    @cached_property
    def strings(self) -> set[str]:
        """Every module-level string constant of the package (header names, the pytest
        plugin's ini name, file names it writes)."""
        found: set[str] = set()
        for values in self.defined.values():
            for value in values:
                if isinstance(value, str):
                    found.add(value)
                elif isinstance(value, (tuple, frozenset)):
                    found |= {item for item in value if isinstance(item, str)}
        return found

    @cached_property
    def prefixed(self) -> set[str]:
        """Other ``singleton_lock_*`` names: the pytest plugin's fixtures, and the string
        constants of the package (message headers, publish options, the ini name)."""
        from celery_singleton_lock import pytest_plugin  # noqa: PLC0415

        names = {name for name, value in vars(pytest_plugin).items()
                 if name.startswith("singleton_lock") and callable(value)}  # fmt: skip
        return names | {value for value in self.strings if value.startswith("singleton_")}

    @cached_property
    def compat_settings(self) -> set[str]:
        """The settings the compat shims read (``singleton_*``, ``ONCE``), as literals."""
        folder = ROOT / PACKAGE / "compat"
        source = "".join(path.read_text(encoding="utf-8") for path in folder.glob("*.py"))
        return set(re.findall(r'"(singleton_\w+|ONCE)"', source))

    @cached_property
    def signals(self) -> set[str]:
        from celery_singleton_lock import signals  # noqa: PLC0415

        return {name for name in signals.__all__ if name.startswith(("lock_", "beat_"))}

    @cached_property
    def events(self) -> set[str]:
        from celery_singleton_lock import _observe  # noqa: PLC0415

        return {value for name, value in vars(_observe).items()
                if name.endswith("_EVENT") and isinstance(value, str)}  # fmt: skip

    @cached_property
    def metrics(self) -> dict[str, frozenset[str]]:
        from celery_singleton_lock.metrics import exposed  # noqa: PLC0415

        found = {series.name: frozenset(series.labels) for series in exposed()}
        for series in exposed():  # a histogram is also named by its family
            found.setdefault(series.family, frozenset(series.labels) - {"le"})
        return found

    @cached_property
    def scripts(self) -> set[str]:
        from celery_singleton_lock.engine.scripts import SCRIPTS  # noqa: PLC0415

        return {name.upper() for name in SCRIPTS}

    @cached_property
    def suffixes(self) -> set[str]:
        from celery_singleton_lock.engine.keyspace import SUFFIXES  # noqa: PLC0415

        return set(SUFFIXES.values())

    @cached_property
    def stack_suffixes(self) -> set[str]:
        from celery_singleton_lock.engine import stack  # noqa: PLC0415

        prefixes = {stack.LIMIT_PREFIX, stack.LINE_PREFIX, stack.WAKE_PREFIX}
        return {*stack.STACK_SUFFIXES.values(), *prefixes}

    @cached_property
    def celery_settings(self) -> set[str]:
        from celery.app.defaults import NAMESPACES, flatten  # noqa: PLC0415

        return {name for name, _ in flatten(NAMESPACES)}

    @cached_property
    def celery_states(self) -> set[str]:
        from celery import states  # noqa: PLC0415

        from celery_singleton_lock.modes.park import PARKED  # noqa: PLC0415

        return {*states.ALL_STATES, "IGNORED", PARKED}

    @cached_property
    def headings(self) -> set[str]:
        """The words the CLI prints as headings: ``locks list`` columns, ``locks limit
        list`` columns, the labels of ``locks explain``."""
        from celery_singleton_lock.ops import cli  # noqa: PLC0415
        from celery_singleton_lock.ops.admin import HEADINGS  # noqa: PLC0415

        words = {*HEADINGS, *cli._EXTRA}
        source = (ROOT / PACKAGE / "ops" / "limits.py").read_text(encoding="utf-8")
        for path in sorted((ROOT / PACKAGE / "ops" / "cli").glob("*.py")):
            source += path.read_text(encoding="utf-8")
        source += (ROOT / PACKAGE / "explain.py").read_text(encoding="utf-8")
        words |= set(re.findall(r'"([A-Z][A-Za-z /-]*)"', source))
        return words

    @cached_property
    def environment(self) -> set[str]:
        """Environment variables the repository's code, scripts and Makefile read or set
        (``os.environ``, ``getenv``, ``$NAME``, ``NAME=``, ``env={"NAME": ...}``)."""
        text = ""
        for name in self.files:
            path = ROOT / name
            if name.startswith("tests/docs/") or not path.is_file():
                continue
            if name.endswith((".py", ".sh", "Makefile", ".yml", "run", ".toml", ".cfg")):
                text += path.read_text(encoding="utf-8", errors="replace") + "\n"
        var = r"([A-Z][A-Z0-9_]{2,})"
        patterns = (
            rf"environ(?:\.get|\.setdefault|\.pop)?\(?\[?\s*[\"']{var}[\"']",
            rf"(?:getenv|setenv|delenv)\(\s*[\"']{var}[\"']",
            rf"\$\{{?\(?{var}",
            rf"^\s*(?:export\s+)?{var}=",
            rf"[\"']{var}[\"']\s*:",
        )
        return {found for pattern in patterns for found in re.findall(pattern, text, re.M)}

    @cached_property
    def files(self) -> list[str]:
        """Every file the repository tracks, and every folder on their paths."""
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()  # fmt: skip
        folders = {str(parent) + "/" for name in listed for parent in Path(name).parents}
        return [*listed, *folders]

    @cached_property
    def written(self) -> set[str]:
        """File names the repository's code writes, as string literals."""
        text = "".join(path.read_text(encoding="utf-8") for folder in ("benchmarks", PACKAGE)
                       for path in (ROOT / folder).rglob("*.py"))  # fmt: skip
        return set(re.findall(r'"([\w.-]+\.(?:json|md|log|txt|png))"', text))

    @cached_property
    def written_names(self) -> set[str]:
        """Identifiers the benchmarks and the invariant checker spell as string literals
        (the soak's faults and invariants)."""
        folders = ("benchmarks", "tests/invariants")
        text = "".join(path.read_text(encoding="utf-8") for folder in folders
                       for path in (ROOT / folder).rglob("*.py"))  # fmt: skip
        return set(re.findall(r'"(\w+)"', text))

    @cached_property
    def commands(self) -> click.Group:
        from celery_singleton_lock.ops.cli import locks  # noqa: PLC0415

        return locks


# ----------------------------------------------------------------------------- resolving


def _assigned(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base) gives its instances ``name``: a dataclass field, an
    annotation, a slot or an assignment ``self.<name> =`` in its source."""
    for klass in inspect.getmro(cls):
        if name in getattr(klass, "__dataclass_fields__", {}) or name in vars(klass).get(
            "__annotations__", {}
        ):
            return True
        if name in (getattr(klass, "__slots__", ()) or ()):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"self\.{re.escape(name)}\s*(:[^=]*)?=(?!=)", source):
            return True
    return False


def _walk(value: Any, attributes: list[str]) -> Any:
    """``value.a.b...``; ``AttributeError`` names the first missing step. A step may be a
    call ``x()`` (the attribute must be callable). A submodule wins over a package's
    attribute of the same name; an instance attribute of a class, or anything below a
    property (computed when used), ends the walk as found."""
    for attribute in attributes:
        called = attribute.endswith("()")
        name = attribute.removesuffix("()")
        if isinstance(value, ModuleType):
            try:  # runtime.sweep: the module, not the function the package imports
                value = importlib.import_module(f"{value.__name__}.{name}")
                continue
            except ImportError:
                pass
        if inspect.isclass(value) and not hasattr(value, name) and _assigned(value, name):
            return None
        if not hasattr(value, name):
            raise AttributeError(f"no {name!r} in {value!r}")
        if inspect.isclass(value):
            raw = inspect.getattr_static(value, name)
            if isinstance(raw, property) or type(raw).__name__ == "cached_property":
                return None
        value = getattr(value, name)
        if called and not callable(value):
            raise AttributeError(f"{name} is not callable")
    return value


def _keywords(arguments: str) -> list[str]:
    """The keyword names of a call's argument text (``a, b=1, c=[x=y]`` -> ``b``)."""
    depth, current, found = 0, "", []
    for char in arguments + ",":
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            match = re.match(rf"\s*({_IDENT})\s*=(?!=)", current)
            if match:
                found.append(match.group(1))
            current = ""
        else:
            current += char
    return found


def _accepts(func: Any, keywords: list[str]) -> str | None:
    """Why ``func`` cannot be called with ``keywords``, or None."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    names = {p.name for p in parameters}
    unknown = [word for word in keywords if word not in names]
    return f"takes no keyword {unknown}" if unknown else None


class Resolver:
    """Checks spans against :class:`Known`; ``redis_commands`` come from a live server."""

    def __init__(self, redis_commands: Iterable[str]) -> None:
        self.known = Known()
        self.redis_commands = {command.upper() for command in redis_commands}
        self._kinds: list[tuple[str, Callable[[str], str | bool | None]]] = [
            ("command line", self.command_line),
            ("key form", self.key_form),
            ("path", self.path),
            ("metric", self.metric),
            ("event", self.event),
            ("setting", self.setting),
            ("option", self.option),
            ("celery setting", self.celery_setting),
            ("python", self.python),
            ("upper-case word", self.upper),
        ]

    def problem(self, text: str) -> str | None:
        """Why ``text`` names nothing the code has, or None (resolved, or not a name)."""
        for kind, check in self._kinds:
            verdict = check(text)
            if verdict is True:
                return None
            if isinstance(verdict, str):
                return f"{kind}: {verdict}"
        return None

    # Each check returns None (not this kind), True (resolved) or why it does not resolve.

    def command_line(self, text: str) -> str | bool | None:
        match = re.match(r"(?:celery\s+(?:-A\s+\S+\s+)?)?locks(?:\s+(.*))?$", text)
        if match is None or not text.startswith(("celery", "locks")):
            return None
        rest = (match.group(1) or "").split()
        return self._command_words(self.known.commands, rest, "locks")

    def _command_words(self, command: click.Command, words: list[str], path: str) -> str | bool:
        options = {opt for param in command.params for opt in param.opts if opt.startswith("-")}
        for at, word in enumerate(words):
            bare = word.strip("[]()")
            if isinstance(command, click.Group):
                choices = [choice for choice in bare.split("|") if choice]
                if bare and all(choice in command.commands for choice in choices):
                    if len(choices) == 1:
                        return self._command_words(command.commands[bare], words[at + 1 :],
                                                   f"{path} {bare}")  # fmt: skip
                    return True
                if re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", bare):
                    return f"`{path}` has no sub-command {bare!r}"
            for option in bare.split("|"):
                if option.startswith("-") and option.split("=")[0] not in options:
                    return f"`{path}` has no option {option!r}"
        return True

    def key_form(self, text: str) -> str | bool | None:
        stack = re.match(r"(?:<prefix>|\w+):\{(?:<prefix>|\w+):stack\}:(.+)$", text)
        if stack:
            rest = stack.group(1)
            return True if self._suffix(rest, self.known.stack_suffixes) else (
                f"no stack key {rest!r} (engine.stack)")  # fmt: skip
        match = re.match(r"(<base>|<key>:|<lock key>:|<name>:|KEY:|\S+\}:)(.+)$", text)
        if match is None or " " in text:
            return None
        rest = match.group(2)
        if rest == "*" or rest.startswith("<"):
            return None  # a pattern of every suffix
        return True if self._suffix(rest, self.known.suffixes) else (
            f"no companion-key suffix {rest!r} (engine.keyspace)")  # fmt: skip

    @staticmethod
    def _suffix(rest: str, suffixes: set[str]) -> bool:
        for suffix in suffixes:
            if suffix.endswith(":"):
                if rest.startswith(suffix) and len(rest) > len(suffix):
                    return True
            elif rest == suffix or rest.startswith(suffix + ":"):
                return True
        return False

    def path(self, text: str) -> str | bool | None:
        bare = re.sub(r":\d+$", "", text)
        if re.search(r"[\s*=\"'|?&]|://", bare) or bare.startswith(("/", ".venv", "$", ".")):
            return None
        if not re.search(r"[a-z]", bare):
            return None  # HOST/PID: a heading
        if not ("/" in bare or bare.endswith(_PATH_EXT)):
            return None
        if bare.endswith(".py") and re.fullmatch(r"\w+\.py", bare) and bare.startswith("_"):
            return None
        files = self.known.files
        candidates = [bare, f"{PACKAGE}/{bare}", f"docs/{bare}", f"benchmarks/{bare}"]
        if any(candidate in files or candidate + "/" in files for candidate in candidates):
            return True
        if "/" not in bare and any(name.rsplit("/", 1)[-1] == bare for name in files):
            return True
        if "<" in bare:
            return None
        if bare.endswith("/") and _importable(bare.rstrip("/")) is not None:
            return True  # celery/: an installed package, in a profile
        if "/" not in bare and bare in self.known.written:
            return True  # a file the code writes (a soak's record)
        return f"no file or folder {bare!r} in the repository"

    def metric(self, text: str) -> str | bool | None:
        match = re.fullmatch(r"(celery_singleton_lock_\w+|_\w+)(?:\{([\w,\s]*)\})?", text)
        if match is None:
            return None
        name, labels = match.group(1), match.group(2)
        if name.startswith("_"):
            if f"singleton_lock{name}" in self.known.settings:
                return True  # a setting's short form in a list of settings
            name = f"celery_singleton_lock{name}"
            if name not in self.known.metrics:
                return None  # a private name, judged as Python
        if name not in self.known.metrics:
            return f"no metric {name} (celery_singleton_lock.metrics)"
        if labels is not None:
            wanted = {label.strip() for label in labels.split(",") if label.strip()}
            missing = wanted - self.known.metrics[name]
            if missing:
                return f"{name} has no label {sorted(missing)}"
        return True

    def event(self, text: str) -> str | bool | None:
        if not re.fullmatch(r"(task-)?lock-[a-z-]+|task-[a-z-]+", text):
            return None
        if text in self.known.events or text in CELERY_EVENTS:
            return True
        return f"no worker event {text!r} (_observe)"

    def setting(self, text: str) -> str | bool | None:
        name = re.split(r"\s*=", text, maxsplit=1)[0]
        django = re.fullmatch(r"CELERY_(SINGLETON_\w+)", name)
        if django:
            name = django.group(1).lower()
        if not re.fullmatch(r"singleton_\w+", name) or name.endswith("_"):
            return None
        if name in self.known.settings or name in self.known.prefixed:
            return True
        if name in self.known.compat_settings:
            return True
        if name.startswith(("singleton_lock_", "singleton_beat_")):
            return f"no setting {name} (options.py)"
        return f"no setting {name} read by the compat shims"

    def option(self, text: str) -> str | bool | None:
        name = re.split(r"\s*=", text, maxsplit=1)[0]
        if not re.fullmatch(r"lock_\w+", name):
            return None
        if name in self.known.options or name in self.known.signals:
            return True
        from celery_singleton_lock import LockedTask  # noqa: PLC0415
        from celery_singleton_lock.compat.once import QueueOnce  # noqa: PLC0415
        from celery_singleton_lock.compat.singleton import Singleton  # noqa: PLC0415

        if any(hasattr(cls, name) for cls in (LockedTask, Singleton, QueueOnce)):
            return True
        return f"no option or signal {name} (options.py, signals.py)"

    def celery_setting(self, text: str) -> str | bool | None:
        name = re.split(r"\s*=", text, maxsplit=1)[0]
        if not re.fullmatch(r"(task|worker|result|broker|beat)_\w+", name) or name == "task_id":
            return None
        import celery.signals  # noqa: PLC0415

        if name in self.known.celery_settings or hasattr(celery.signals, name):
            return True
        if name in self.known.signals:
            return True  # one of ours: the beat group's signals
        if name in self.known.written_names:
            return True  # a fault or invariant of the soak, named in its code
        return f"no Celery setting or signal {name}"

    def python(self, text: str) -> str | bool | None:
        call = _CALL.fullmatch(text)
        keywords: list[str] = []
        if call and not text.endswith("()"):
            name, keywords = call.group(1), _keywords(call.group(2))
        else:
            name = text
        alias = next((a for a in ALIASES if name.startswith(a + ".")), None)
        if alias is not None:
            module, attribute = ALIASES[alias]
            head: Any = getattr(importlib.import_module(module), attribute)
            return self._resolved(head, name[len(alias) + 1 :].split("."), keywords, text)
        if _DOTTED.fullmatch(name):
            return self._dotted(name, keywords, text)
        if re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*|[A-Z]\w*(Error|Exception|Exceeded)", name):
            return self._bare(name, keywords, text)
        if keywords and name in self.known.defined:
            return self._any(self.known.defined[name], [], keywords, text)
        return None

    def _any(self, candidates: list[Any], attributes: list[str], keywords: list[str],
             text: str) -> str | bool:  # fmt: skip
        """Resolved when one of the objects a name has in the package resolves."""
        why: str | bool = f"{text}: nothing"
        for candidate in candidates:
            why = self._resolved(candidate, attributes, keywords, text)
            if why is True:
                return True
        return why

    def _dotted(self, name: str, keywords: list[str], text: str) -> str | bool | None:
        parts = name.split(".")
        head = parts[0].removesuffix("()")
        if head == PACKAGE:
            return self._resolved(importlib.import_module(PACKAGE), parts[1:], keywords, text)
        if f"{PACKAGE}.{head}" in self.known.module_names:  # options.X, runtime.sweep.X
            module = importlib.import_module(f"{PACKAGE}.{head}")
            first = parts[1].removesuffix("()")
            plain_module = not hasattr(module, "__path__")
            if plain_module and first[:1].islower() and not hasattr(module, first):
                return None  # client.lock(...): a variable named like a module
            return self._resolved(module, parts[1:], keywords, text)
        if head in self.known.defined and head[:1].isupper():  # RedisLock.ensure_held()
            return self._any(self.known.defined[head], parts[1:], keywords, text)
        if head in BENCH_ONLY and _importable(head) is None:
            return None
        module = _importable(head) if not head[:1].isupper() else None
        if module is not None:
            return self._resolved(module, parts[1:], keywords, text)
        if head[:1].isupper():
            found = self._third_party(head)
            if found is not None:
                return self._resolved(found, parts[1:], keywords, text)
            return f"{head} is defined nowhere the docs could mean"
        return None  # an attribute of a user's object (store.set, client.lock)

    def _bare(self, name: str, keywords: list[str], text: str) -> str | bool | None:
        if name in self.known.defined:
            return self._any(self.known.defined[name], [], keywords, text)
        found = self._third_party(name)
        if found is not None:
            return self._resolved(found, [], keywords, text)
        if hasattr(builtins, name):
            return True
        return f"{name} is defined nowhere the docs could mean"

    @staticmethod
    def _third_party(name: str) -> Any:
        for module_name in THIRD_PARTY:
            module = _importable(module_name)
            if module is not None and hasattr(module, name):
                return getattr(module, name)
        return None

    @staticmethod
    def _resolved(head: Any, attributes: list[str], keywords: list[str], text: str) -> str | bool:
        try:
            value = _walk(head, [a for a in attributes if a])
        except AttributeError as exc:
            return str(exc)
        if keywords:
            target = value.__init__ if inspect.isclass(value) else value
            why = _accepts(target, keywords)
            if why:
                return f"{text}: {why}"
        return True

    def upper(self, text: str) -> str | bool | None:
        words = text.split()
        if not words or not re.fullmatch(r"[A-Z][A-Z0-9_]+", words[0]):
            return None
        if words[0].endswith("_") and words[0] not in self.known.strings:
            return None  # a prefix (CELERY_), not a name
        word = words[0]
        two = " ".join(words[:2])
        known = self.known
        import signal  # noqa: PLC0415

        from celery import states  # noqa: PLC0415

        if (word in known.scripts or word in self.redis_commands or two in self.redis_commands
                or word in REDIS_ERRORS or word in known.celery_states
                or hasattr(states, word) or word in known.defined or word in known.strings
                or text in known.headings or word in known.headings
                or word in known.environment or hasattr(builtins, word)
                or hasattr(signal, word) or self._third_party(word) is not None):  # fmt: skip
            return True
        return f"{word}: no script, Redis command or error, state, constant, heading or variable"

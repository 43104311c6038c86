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
- docs/beat.md: the beat settings (``beat.config.reference_markdown``) and the table of the
  last ``python -m benchmarks.beat_failover`` run committed in docs/beat/failover.json
  (:func:`beat_failover_markdown`);
- docs/deployment.md: the least-privilege ACL of the lock Redis (:func:`acl_markdown`):
  the commands ``ops.checks`` derives from the scripts and the engine, and one key pattern
  per companion-key suffix of ``engine.keyspace``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.docs.cli_samples, when run as a script

from benchmarks.beat_failover import markdown as failover_table  # noqa: E402 - after the path
from celery_singleton_lock import metrics  # noqa: E402
from celery_singleton_lock._observe import (  # noqa: E402
    events_markdown,
    signals_markdown,
    skip_record_key,
)
from celery_singleton_lock.beat.config import reference_markdown as beat_settings  # noqa: E402
from celery_singleton_lock.engine.keyspace import SUFFIXES  # noqa: E402
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


# ------------------------------------------------------------------------------ blocks


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
    Block("docs/deployment.md", "ACL", acl_markdown),
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

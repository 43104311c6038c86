"""The reference tables of the signals and the worker events for the docs, generated from
the sources of this package: every ``Signal``'s docstring, and the keywords and fields
every ``emit`` and event helper call really passes."""

from __future__ import annotations

import ast
import inspect
import re
from types import ModuleType

from celery_singleton_lock._observe import beat, emit, objects, runlock, skips

#: The modules whose sources send signals and events.
_SENDING: tuple[ModuleType, ...] = (objects, runlock, emit, skips, beat)


def _trees() -> list[ast.Module]:
    return [ast.parse(inspect.getsource(module)) for module in _SENDING]


def _signal_docs() -> list[tuple[str, str, set[str]]]:
    """``(name, docstring, keywords sent)`` of every public signal, in the order
    :mod:`.objects` defines them: the docstring written under each ``Signal(...)``, and the
    keyword arguments of every ``emit(<signal>, ...)`` call in this package (read from the
    sources, so the reference can never list a keyword that is not sent, or miss one that
    is)."""
    found: list[tuple[str, str]] = []
    body = ast.parse(inspect.getsource(objects)).body
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Signal"
            and isinstance(node.targets[0], ast.Name)
        ):
            doc = ""
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                doc = str(following.value.value)
            found.append((node.targets[0].id, doc))
    sent: dict[str, set[str]] = {name: set() for name, _ in found}
    for sending in (node for tree in _trees() for node in ast.walk(tree)):
        if (
            isinstance(sending, ast.Call)
            and isinstance(sending.func, ast.Name)
            and sending.func.id == "emit"
            and sending.args
            and isinstance(sending.args[0], ast.Name)
            and sending.args[0].id in sent
        ):
            sent[sending.args[0].id].update(k.arg for k in sending.keywords if k.arg is not None)
    return [(name, doc, sent[name]) for name, doc in found]


def _markdown(text: str) -> str:
    """A docstring as one line of Markdown: ````x```` becomes ```x```, ``|`` is escaped."""
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def documented_keywords(doc: str) -> set[str]:
    """The keyword argument names a signal's docstring lists after "Keyword arguments:"
    (names in double backticks, outside parentheses)."""
    doc = " ".join(doc.split())
    listed = doc.split("Keyword arguments:", 1)[-1] if "Keyword arguments:" in doc else ""
    depth, outside = 0, []
    for ch in listed:
        depth += ch == "("
        if depth == 0:
            outside.append(ch)
        depth -= ch == ")" and depth > 0
    return set(re.findall(r"``([a-z_]+)``", "".join(outside)))


def signals_markdown() -> str:
    """The reference table of the signals for the docs, generated from this module: each
    ``Signal``'s docstring split into when it is sent, its sender and its keyword
    arguments. ``ValueError`` when a docstring and the keywords actually sent disagree."""
    lines = [
        "| signal | sent when | sender | keyword arguments |",
        "|---|---|---|---|",
    ]
    for name, doc, sent in _signal_docs():
        documented = documented_keywords(doc)
        if documented != sent:
            raise ValueError(
                f"{name}: its docstring lists {sorted(documented)}, it is sent with {sorted(sent)}"
            )
        when, _, rest = " ".join(doc.split()).partition("Sender:")
        sender, _, keywords = rest.partition("Keyword arguments:")
        lines.append(
            f"| `{name}` | {_markdown(when)} | {_markdown(sender).rstrip('.')} "
            f"| {_markdown(keywords).rstrip('.')} |"
        )
    return "\n".join(lines) + "\n"


#: Who sends an event, by the helper that sends it.
_EVENT_SENDERS = {
    "worker_event": (
        "the worker the message was delivered to, when it sends task events (`-E`)",
        ("uuid", "name", "hostname"),
    ),
    "producer_event": (
        "the producer, when the app sets `task_send_sent_event`",
        ("uuid", "name"),
    ),
    "send": ("the process that ran `celery locks reap`", ()),
    "beat_event": (
        "the beat leader (`celery_singleton_lock.beat`), when the app sets "
        "`worker_send_task_events`",
        (),
    ),
}


def _sender_order(item: tuple[str, set[str]]) -> int:
    """Sort the senders of one event as :data:`_EVENT_SENDERS` lists them (the worker
    first)."""
    return list(_EVENT_SENDERS).index(item[0])


def events_markdown() -> str:
    """The reference table of the worker events for the docs, generated from this
    package's sources: every ``worker_event``, ``producer_event``, ``beat_event`` and
    dispatcher ``send`` of an ``*_EVENT`` constant, with the fields it passes."""
    found: dict[str, dict[str, set[str]]] = {}
    for node in (node for tree in _trees() for node in ast.walk(tree)):
        if not isinstance(node, ast.Call):
            continue
        helper = (
            node.func.id
            if isinstance(node.func, ast.Name)
            else node.func.attr
            if isinstance(node.func, ast.Attribute)
            else ""
        )
        if helper not in _EVENT_SENDERS:
            continue
        names = [arg.id for arg in node.args if isinstance(arg, ast.Name)]
        constant = next((name for name in names if name.endswith("_EVENT")), None)
        if constant is None:
            continue
        event = str(getattr(objects, constant))
        fields = found.setdefault(event, {}).setdefault(helper, set())
        fields.update(_EVENT_SENDERS[helper][1])
        fields.update(k.arg for k in node.keywords if k.arg is not None)
    lines = ["| event | sent by | fields |", "|---|---|---|"]
    for event in sorted(found):
        for helper, fields in sorted(found[event].items(), key=_sender_order):
            shown = ", ".join(f"`{field}`" for field in sorted(fields))
            lines.append(f"| `{event}` | {_EVENT_SENDERS[helper][0]} | {shown} |")
    return "\n".join(lines) + "\n"

"""The stacked limits as the code gives them (``lock_limits`` of each task) and their names:
which templates a name renders, the closest template to a name, and what a name may hold.
Part of ``celery locks limit`` (:mod:`.limits` reads them against the lock Redis)."""

from __future__ import annotations

import contextlib
import difflib
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery.exceptions import ImproperlyConfigured

from celery_singleton_lock.engine.stack import MAX_NAME
from celery_singleton_lock.runtime.locking import locking_for

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "CodeLimit",
    "closest",
    "code_limits",
    "has_fields",
    "name_problem",
    "renders",
    "templates_of",
]


@dataclass(frozen=True)
class CodeLimit:
    """One ``(template, number)`` pair of a registered task's ``lock_limits``."""

    template: str
    number: int
    task: str


def code_limits(app: Celery) -> list[CodeLimit]:
    """Every ``lock_limits`` pair of the app's locked tasks (their modules imported first),
    by template then task. A task that is not locked, has no limits, or whose options are
    invalid (a worker refuses it anyway) gives none."""
    with contextlib.suppress(Exception):  # a task module that fails to import
        app.loader.import_default_modules()
    found: list[CodeLimit] = []
    for name, task in sorted(app.tasks.items()):
        try:
            locking = locking_for(task)
        except ImproperlyConfigured:
            continue
        if locking is None or not locking.options.limits:
            continue
        found.extend(
            CodeLimit(template, number, name) for template, number in locking.options.limits
        )
    return sorted(found, key=lambda item: (item.template, item.task, item.number))


def _fields(template: str) -> list[tuple[str, bool]]:
    """``template`` as (text, is a field) pieces; a template ``str.format`` cannot read is
    all fixed text (it renders nothing else)."""
    pieces: list[tuple[str, bool]] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return [(template, False)]
    for literal, name, _, _ in parsed:
        if literal:
            pieces.append((literal, False))
        if name is not None:
            pieces.append((name, True))
    return pieces


def has_fields(template: str) -> bool:
    """Whether ``template`` reads any argument (else it names one limit shared by all)."""
    return any(is_field for _, is_field in _fields(template))


def _pattern(template: str) -> re.Pattern[str]:
    """What the renderings of ``template`` look like: its fixed text as it is, each field
    some non-empty text without a colon or a brace (a rendered value never holds one, so a
    mistyped template is not taken for a rendering)."""
    return re.compile(
        "".join("[^:{}]+" if is_field else re.escape(text) for text, is_field in _fields(template))
    )


def renders(template: str, name: str) -> bool:
    """Whether ``name`` is ``template`` itself or a plausible rendering of it."""
    return name == template or _pattern(template).fullmatch(name) is not None


def templates_of(name: str, templates: Iterable[str]) -> tuple[str, ...]:
    """The templates among ``templates`` whose limit ``name`` is: the template itself when
    ``name`` is a template with fields, else every template it is or renders."""
    known = tuple(dict.fromkeys(templates))
    if name in known and has_fields(name):
        return (name,)
    return tuple(template for template in known if renders(template, name))


def _tokens(text: str) -> list[str]:
    return text.split(":")


def _likeness(name: str, template: str) -> float:
    """How alike ``name`` and a rendering of ``template`` are (0..1): colon-separated parts
    compared in turn, a part that is all field matching anything; else the whole texts."""
    whole = difflib.SequenceMatcher(None, name, template).ratio()
    names, parts = _tokens(name), _tokens(template)
    if len(names) != len(parts):
        return whole
    scores = [
        1.0
        if renders(part, given)
        else difflib.SequenceMatcher(
            None, given, "".join(text for text, is_field in _fields(part) if not is_field)
        ).ratio()
        for given, part in zip(names, parts, strict=True)
    ]
    return max(whole, sum(scores) / len(scores))


def closest(name: str, templates: Sequence[str]) -> str | None:
    """The rendering (or template) most like ``name``, for a "did you mean": the closest
    template with the parts of ``name`` that stand where its fields are; None when no
    template is close."""
    scored = sorted(((_likeness(name, template), template) for template in templates), reverse=True)
    if not scored or scored[0][0] < 0.75:
        return None
    template = scored[0][1]
    names, parts = _tokens(name), _tokens(template)
    if len(names) == len(parts):
        filled = [
            given if any(is_field for _, is_field in _fields(part)) else part
            for given, part in zip(names, parts, strict=True)
        ]
        guess = ":".join(filled)
        if renders(template, guess):
            return guess
    return template


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a limit's name or template (None when it can): it must have 1
    to ``MAX_NAME`` characters, none of them whitespace or unprintable."""
    if not name:
        return "a limit name cannot be empty"
    if len(name) > MAX_NAME:
        return f"a limit name has at most {MAX_NAME} characters, this one {len(name)}"
    if any(ch.isspace() or not ch.isprintable() for ch in name):
        return f"a limit name cannot hold whitespace or unprintable characters: {name!r}"
    return None

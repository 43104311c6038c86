"""Stacked limits of a task (``lock_limits``, ``lock_weight``): the limit names a call's
bound arguments render, its weight, and the :class:`~.engine.stack.Stack` its run takes a
share of. Pure functions, no Redis.

A template is a ``str.format`` string over parameter names, ``"tenant:{tenant_id}"``; a
template without fields (``"global:exports"``) is one budget shared by every call. A value
renders as itself when it is a short plain string or an int, else as a digest of its
canonical form (as lock keys are built), so odd arguments never break a name.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_singleton_lock.engine.stack import MAX_NAME, Limit, Stack, stack_base
from celery_singleton_lock.keys import bind_arguments, canonical_json

__all__ = [
    "MAX_WEIGHT",
    "LimitsOption",
    "WeightOption",
    "call_stack",
    "check_limit_fields",
    "parse_limits",
    "render_limit",
    "stack_tag",
    "template_fields",
]

LimitsOption = tuple[tuple[str, int], ...]
WeightOption = int | Callable[..., Any]
#: The heaviest weight a run may have (a share is one member of a sorted set either way).
MAX_WEIGHT = 1_000_000
#: A rendered value longer than this, or with characters outside a safe set, is digested.
_PLAIN_MAX = 64
_PLAIN = frozenset(string.ascii_letters + string.digits + "-_.@+=,;/")


def template_fields(template: str) -> tuple[str, ...]:
    """The parameter names a template reads; ``ValueError`` for a template that is not a
    plain ``str.format`` string over names (no indexing, attributes or conversions)."""
    fields: list[str] = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"limit template {template!r}: fields must be plain parameter names like "
                f"{{tenant_id}}, got {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}"
            )
        fields.append(name)
    return tuple(fields)


def parse_limits(value: object) -> tuple[tuple[str, int], ...]:
    """``lock_limits`` as given: a list of ``(template, N)`` pairs, N a whole number >= 0,
    each template once; ``ValueError`` saying what is wrong."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"must be a list of (template, N) pairs, got {value!r}")
    result: list[tuple[str, int]] = []
    for item in value:
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"each limit must be a (template, N) pair, got {item!r}")
        template, number = item
        if not isinstance(template, str) or not template.strip():
            raise ValueError(f"a limit template must be a non-empty str, got {template!r}")
        if any(ch.isspace() or not ch.isprintable() for ch in template):
            raise ValueError(f"a limit template cannot hold whitespace, got {template!r}")
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(f"limit {template!r}: N must be a whole number >= 0, got {number!r}")
        template_fields(template)
        if len(template) > MAX_NAME:
            raise ValueError(f"limit template {template[:40]!r}...: longer than {MAX_NAME}")
        if any(template == seen for seen, _ in result):
            raise ValueError(f"limit {template!r} is listed twice")
        result.append((template, number))
    return tuple(result)


def check_limit_fields(
    func: Callable[..., Any], limits: LimitsOption, parameters: Sequence[str] | None
) -> None:
    """``ValueError`` when a template reads a name that is not one of ``parameters`` (those
    of ``func``; None: any name binds)."""
    if parameters is None:
        return
    for template, _ in limits:
        unknown = [name for name in template_fields(template) if name not in parameters]
        if unknown:
            raise ValueError(
                f"limit template {template!r} reads {unknown!r}, which are not parameters of "
                f"{getattr(func, '__qualname__', func)!r}; its parameters are {list(parameters)!r}"
            )


def _rendered(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        text = ""
    if text and len(text) <= _PLAIN_MAX and all(ch in _PLAIN for ch in text):
        return text
    digest = hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()
    return "#" + digest[:24]


def render_limit(template: str, bound: Mapping[str, Any]) -> str:
    """The name of a limit for one call's bound arguments: each field as the value's short
    plain text, else a digest of it (``#…``); a field the call did not bind renders as
    ``#missing``."""
    values = {
        name: (_rendered(bound[name]) if name in bound else "#missing")
        for name in template_fields(template)
    }
    return template.format_map(values)[:MAX_NAME]


def stack_tag(prefix: str) -> str:
    """The hash tag shared by every stacked key of an app with key ``prefix``."""
    return stack_base(prefix).split("{", 1)[1].split("}", 1)[0]


def _weight(weight: WeightOption, bound: Mapping[str, Any]) -> int:
    value = weight(**bound) if callable(weight) else weight
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WEIGHT:
        raise ValueError(
            f"lock_weight must give a whole number from 1 to {MAX_WEIGHT}, got {value!r}"
        )
    return value


def call_stack(  # noqa: PLR0917 - the call's parts, in the order the task layer has them
    prefix: str,
    func: Callable[..., Any],
    limits: LimitsOption,
    weight: WeightOption,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Stack:
    """The stack one call's run takes a share of: each limit rendered from its bound
    arguments, at the call's weight (a callable weight is called with them as keyword
    arguments)."""
    bound = bind_arguments(func, args, kwargs)
    rendered = tuple(
        Limit(render_limit(template, bound), template, number) for template, number in limits
    )
    seen: dict[str, Limit] = {}
    for limit in rendered:  # two templates rendering one name: the smaller number counts
        if limit.name not in seen or limit.number < seen[limit.name].number:
            seen[limit.name] = limit
    return Stack(stack_base(prefix), tuple(seen.values()), _weight(weight, bound))

"""Task name + arguments -> one canonical, bounded Redis key (pure functions, no Celery).

A lock key looks like ``csl:shop.buy:{3f2a…}``: the prefix, the task name made readable,
and a hash-tagged digest. The braces make the digest the Redis Cluster hash tag, so every
key of one lock lands in one slot. The digest is the first 32 hex characters of the
SHA-256 of the full task name and the canonical text of the chosen arguments, so the key
length is bounded whatever the arguments are.

Arguments are first bound to the task's signature (defaults applied), so ``f(1, b=2)``,
``f(1, 2)`` and ``f(a=1, b=2)`` are the same work. They are then written as canonical
JSON: the same value always gives the same text and different values give different
text. The rules:

* ``None``, ``bool``, ``int``, ``float`` and ``str`` are written as JSON writes them, so
  ``True``, ``1`` and ``1.0`` are three different keys (as they are three different JSON
  values on the wire). ``-0.0`` is written as ``0.0``; NaN and the infinities are tagged.
* ``tuple`` and ``list`` are the same: Celery's JSON serializer turns tuples into lists on
  the way to the worker, so the worker could not tell them apart anyway.
* dict keys are sorted after being tagged with their type, so ``{1: x}`` and ``{"1": x}``
  differ; any other mapping is written like a dict.
* ``set``/``frozenset`` (elements sorted by their canonical text), ``bytes``/``bytearray``
  (base64), ``Decimal`` (trailing zeros dropped, so ``Decimal("1.50")`` equals ``Decimal("1.5")``),
  ``datetime`` (aware ones converted to UTC), ``date``, ``time``, ``timedelta``, ``UUID``,
  ``complex``, paths, ``Enum`` members (class + value) and dataclass instances (class +
  fields that take part in equality) are written as tagged JSON objects.
* An object whose class defines ``__lock_key__()`` is written as the class and whatever
  that method returns; this wins over every rule below the built-in scalars.
* An object with a ``model_dump()`` method (pydantic models) is written as its dump.
* **Any other object contributes only its class's qualified name.** Two such arguments of
  one class therefore share a lock: that over-locks, the safe direction, and never puts
  a ``repr`` with a memory address in a key. A warning is logged once per class; define
  ``__lock_key__`` on the class, or choose ``lock_keys``, to do better.
* Self-referencing structures are written with a ``cycle`` marker, and nesting deeper
  than :data:`MAX_DEPTH` levels is cut off with a ``deep`` marker. Encoding never raises.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import enum
import functools
import hashlib
import inspect
import json.encoder
import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import PurePath
from typing import Any

__all__ = [
    "DIGEST_LENGTH",
    "MAX_DEPTH",
    "MAX_TASK_NAME_LENGTH",
    "bind_arguments",
    "canonical_json",
    "check_lock_keys",
    "readable_task_name",
    "signature_names",
    "task_lock_key",
]

logger = logging.getLogger("celery_singleton_lock.keys")

#: Hex characters of the SHA-256 digest kept in a key (128 bits).
DIGEST_LENGTH = 32
#: Characters of the task name kept in the readable part of a key.
MAX_TASK_NAME_LENGTH = 120
#: Nesting levels encoded before a value is cut off with a ``deep`` marker.
MAX_DEPTH = 100

# Ints wider than this are written in hex: their decimal form could exceed Python's
# int-to-str digit limit, whose smallest allowed setting (640 digits) is above this.
_MAX_DECIMAL_INT_BITS = 2000

_ARGS_FALLBACK = "*args"
_KWARGS_FALLBACK = "**kwargs"

_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii

# Stands for a ``lock_keys`` name the call did not pass (possible under ``**kwargs``).
_MISSING = object()


def _qualname(cls: type) -> str:
    """``module.QualName`` of a class, tolerating classes that lack either attribute."""
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    return f"{module}.{name}" if isinstance(module, str) else str(name)


# --------------------------------------------------------------------------- binding


@functools.lru_cache(maxsize=1024)
def _cached_signature(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature`` memoised: binding runs on every call of a locked task."""
    return inspect.signature(func)


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature of ``func``, or None when Python cannot tell it."""
    try:
        return _cached_signature(func)
    except TypeError:  # unhashable callable, or not introspectable
        try:
            return inspect.signature(func)
        except (TypeError, ValueError):
            return None
    except ValueError:
        return None


def bind_arguments(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind ``args``/``kwargs`` to ``func``'s signature with defaults applied.

    ``f(1, b=2)``, ``f(1, 2)`` and ``f(a=1, b=2)`` give the same dict. A ``*args``
    parameter maps to a list under its name and a ``**kwargs`` parameter to a dict.
    Never raises: arguments that do not fit the signature (the task will fail on them
    anyway) give ``{"*args": [...], "**kwargs": {...}}``, which no real binding can.
    """
    signature = _signature(func)
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            pass
        else:
            bound.apply_defaults()
            result: dict[str, Any] = {}
            for name, value in bound.arguments.items():
                kind = signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    result[name] = list(value)
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    result[name] = dict(value)
                else:
                    result[name] = value
            return result
    return {_ARGS_FALLBACK: list(args), _KWARGS_FALLBACK: dict(kwargs)}


def signature_names(func: Callable[..., Any]) -> tuple[str, ...] | None:
    """The parameter names of ``func``; None when any name binds (it takes ``**kwargs``, or
    its signature cannot be read)."""
    signature = _signature(func)
    if signature is None or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    ):
        return None
    return tuple(signature.parameters)


def check_lock_keys(func: Callable[..., Any], lock_keys: object) -> None:
    """Raise ``ValueError`` unless ``lock_keys`` is usable with ``func``.

    Accepted: ``None``, a callable, or a list/tuple of ``str`` naming parameters of
    ``func`` (any name when ``func`` takes ``**kwargs`` or has no introspectable
    signature). Checked once when a task is set up, so a typo fails loudly, not silently.
    """
    if lock_keys is None or callable(lock_keys):
        return
    if not isinstance(lock_keys, (list, tuple)):
        hint = " (wrap a single name in a list: ['name'])" if isinstance(lock_keys, str) else ""
        raise ValueError(
            "lock_keys must be None, a callable (args, kwargs) -> str, or a list/tuple of "
            f"parameter names; got {type(lock_keys).__name__}{hint}"
        )
    not_str = [name for name in lock_keys if not isinstance(name, str)]
    if not_str:
        raise ValueError(
            f"lock_keys must contain parameter names as str; got {not_str!r} in {list(lock_keys)!r}"
        )
    signature = _signature(func)
    if signature is None:
        return
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = [name for name in lock_keys if name not in parameters]
    if unknown:
        func_name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        raise ValueError(
            f"lock_keys names {unknown!r} that are not parameters of {func_name}"
            f"{signature}; its parameters are {list(parameters)!r}"
        )


# --------------------------------------------------------------------- canonical JSON


_warned_lock = threading.Lock()
_warned_types: set[str] = set()


def _warn_once(kind: str, qualname: str, detail: str) -> None:
    """Log one warning per (kind, class), not one per call: this runs on every task call."""
    token = f"{kind}:{qualname}"
    with _warned_lock:
        if token in _warned_types:
            return
        _warned_types.add(token)
    logger.warning(detail)


def _tagged(tag: str, payload_json: str) -> str:
    """A JSON object ``{"$tag": payload}``; user dict keys always start with a type
    letter and a colon, so a ``$`` key can never come from user data."""
    return f'{{"${tag}":{payload_json}}}'


def _object_fallback(value: object, reason: str) -> str:
    """The documented safe rule: only the class's qualified name, logged once per class."""
    name = _qualname(type(value))
    _warn_once(
        "object",
        name,
        f"lock key: {name} has no canonical form ({reason}); every {name} argument counts "
        "as the same value, so calls differing only in it share one lock. Define "
        "__lock_key__() on the class or choose lock_keys to tell them apart.",
    )
    return _tagged("object", _encode_str(name))


def _encode_float(value: float) -> str:
    """JSON number text for a finite float, a tag for NaN and the infinities."""
    if math.isnan(value):
        return _tagged("float", '"nan"')
    if math.isinf(value):
        return _tagged("float", '"inf"' if value > 0 else '"-inf"')
    if value == 0.0:
        return "0.0"  # -0.0 == 0.0 in Python: one key
    return float.__repr__(value)


def _encode_int(value: int) -> str:
    """JSON number text for an int; hex for very wide ints (the digit limit cannot bite)."""
    number = value if type(value) is int else int.__int__(value)
    if number.bit_length() > _MAX_DECIMAL_INT_BITS:
        return _tagged("int", _encode_str(format(number, "x")))
    return int.__repr__(number)


def _encode_datetime(value: dt.datetime) -> str:
    """ISO text; aware datetimes in UTC so one instant written in two zones is one key."""
    if value.tzinfo is not None and value.utcoffset() is not None:
        # At the edge of the representable range keep the original offset.
        with contextlib.suppress(OverflowError, ValueError):
            value = value.astimezone(dt.timezone.utc)
    return _tagged("datetime", _encode_str(value.isoformat()))


def _encode_decimal(value: Decimal) -> str:
    """Digits without trailing zeros and an exponent, so equal Decimals such as
    ``Decimal("1.50")`` and ``Decimal("1.5")`` are one key. Plain integer arithmetic:
    ``normalize()`` would round to the current context's precision."""
    if not value.is_finite():
        return _tagged("decimal", _encode_str(str(value)))  # NaN, sNaN, ±Infinity
    sign, digits, exponent = value.as_tuple()
    text = "".join(map(str, digits)).lstrip("0")
    if not text:
        return _tagged("decimal", '"0"')  # Decimal("-0.00") == Decimal("0")
    stripped = text.rstrip("0")
    exponent = int(exponent) + len(text) - len(stripped)
    return _tagged("decimal", _encode_str(f"{'-' if sign else ''}{stripped}E{exponent}"))


class _Encoder:
    """One canonical-JSON pass over a value, tracking the containers being written."""

    __slots__ = ("stack",)

    def __init__(self) -> None:
        self.stack: dict[int, int] = {}  # id(container) -> depth at which it is open

    def encode(self, value: object, depth: int) -> str:
        """Canonical JSON text of ``value`` found at nesting level ``depth``."""
        kind = type(value)
        # Fast paths: the common argument types, exactly (not subclasses).
        if kind is str:
            return _encode_str(value)  # type: ignore[arg-type]
        if value is None:
            return "null"
        if kind is bool:
            return "true" if value else "false"
        if kind is int:
            return _encode_int(value)  # type: ignore[arg-type]
        if kind is float:
            return _encode_float(value)  # type: ignore[arg-type]
        if depth > MAX_DEPTH:
            name = _qualname(kind)
            _warn_once(
                "deep",
                name,
                f"lock key: arguments nested deeper than {MAX_DEPTH} levels are cut off "
                f"(at a {name}); values differing only below that depth share one lock.",
            )
            return _tagged("deep", _encode_str(name))
        marker = id(value)
        opened_at = self.stack.get(marker)
        if opened_at is not None:
            return _tagged("cycle", str(depth - opened_at))
        self.stack[marker] = depth
        try:
            return self._encode_object(value, depth)
        except RecursionError:
            raise
        except Exception as exc:  # noqa: BLE001 - user objects may raise anything; never fail
            return _object_fallback(value, f"encoding it raised {type(exc).__name__}")
        finally:
            del self.stack[marker]

    def _encode_object(self, value: object, depth: int) -> str:
        """Everything but the exact JSON scalars; see the module docstring for the order."""
        if value is _MISSING:
            return _tagged("missing", "true")
        cls = type(value)
        hook = getattr(cls, "__lock_key__", None)
        if hook is not None and callable(hook):
            payload = self.encode(value.__lock_key__(), depth + 1)  # type: ignore[attr-defined]
            return _tagged("lock_key", f"[{_encode_str(_qualname(cls))},{payload}]")
        if isinstance(value, enum.Enum):
            payload = self.encode(value.value, depth + 1)
            return _tagged("enum", f"[{_encode_str(_qualname(cls))},{payload}]")
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return _encode_int(value)
        if isinstance(value, float):
            return _encode_float(float.__float__(value))
        if isinstance(value, str):
            return _encode_str(str.__str__(value))
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(self.encode(item, depth + 1) for item in value) + "]"
        if isinstance(value, Mapping):
            return self._encode_mapping(value, depth)
        if isinstance(value, (set, frozenset)):
            items = sorted(self.encode(item, depth + 1) for item in value)
            return _tagged("set", "[" + ",".join(items) + "]")
        if isinstance(value, (bytes, bytearray, memoryview)):
            text = base64.b64encode(bytes(value)).decode("ascii")
            return _tagged("bytes", _encode_str(text))
        if isinstance(value, Decimal):
            return _encode_decimal(value)
        if isinstance(value, dt.datetime):
            return _encode_datetime(value)
        if isinstance(value, dt.date):
            return _tagged("date", _encode_str(value.isoformat()))
        if isinstance(value, dt.time):
            return _tagged("time", _encode_str(value.isoformat()))
        if isinstance(value, dt.timedelta):
            parts = f"[{value.days},{value.seconds},{value.microseconds}]"
            return _tagged("timedelta", parts)
        if isinstance(value, uuid.UUID):
            return _tagged("uuid", _encode_str(str(value)))
        if isinstance(value, complex):
            parts = f"[{_encode_float(value.real)},{_encode_float(value.imag)}]"
            return _tagged("complex", parts)
        if isinstance(value, PurePath):
            parts = f"[{_encode_str(_qualname(cls))},{_encode_str(str(value))}]"
            return _tagged("path", parts)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {
                field.name: getattr(value, field.name)
                for field in dataclasses.fields(value)
                if field.compare
            }
            payload = self._encode_mapping(fields, depth)
            return _tagged("dataclass", f"[{_encode_str(_qualname(cls))},{payload}]")
        dump = getattr(cls, "model_dump", None)
        if dump is not None and callable(dump):
            payload = self.encode(value.model_dump(), depth + 1)  # type: ignore[attr-defined]
            return _tagged("model", f"[{_encode_str(_qualname(cls))},{payload}]")
        return _object_fallback(value, "not a JSON value, no __lock_key__() or model_dump()")

    def _encode_mapping(self, value: Mapping[Any, Any], depth: int) -> str:
        """A JSON object with type-tagged keys, sorted; ``s:`` for str keys, ``j:`` +
        canonical JSON for every other key, so ``{1: x}`` and ``{"1": x}`` differ."""
        entries: list[tuple[str, str]] = []
        for key, item in value.items():
            if isinstance(key, str) and not isinstance(key, enum.Enum):
                tagged_key = "s:" + str.__str__(key)
            else:
                tagged_key = "j:" + self.encode(key, depth + 1)
            entries.append((_encode_str(tagged_key), self.encode(item, depth + 1)))
        entries.sort()
        return "{" + ",".join(f"{key}:{item}" for key, item in entries) + "}"


def canonical_json(value: Any) -> str:
    """Deterministic JSON text for ``value``: equal arguments give equal text (see the
    module docstring for the rules). Never raises."""
    try:
        return _Encoder().encode(value, 0)
    except RecursionError:
        # Only when the caller's own stack is already nearly exhausted; a fixed marker
        # keeps the result deterministic (and over-locks, the safe direction).
        return _tagged("unencodable", _encode_str(_qualname(type(value))))


# ------------------------------------------------------------------------------ key


@functools.lru_cache(maxsize=4096)
def readable_task_name(task_name: str) -> str:
    """The task name as shown in a key: ``{``, ``}``, whitespace and other unprintable
    characters (controls, lone surrogates) replaced by ``_``, cut to 120 characters."""
    return "".join(
        "_" if ch in "{}" or ch.isspace() or not ch.isprintable() else ch
        for ch in task_name[:MAX_TASK_NAME_LENGTH]
    )


def _keyword_extras(func: Callable[..., Any], bound: Mapping[str, Any]) -> Mapping[str, Any]:
    """The keyword arguments collected by ``func``'s ``**kwargs`` (or by the fallback
    binding), where ``lock_keys`` names that are not parameters are looked up."""
    if _KWARGS_FALLBACK in bound:
        extras: Mapping[str, Any] = bound[_KWARGS_FALLBACK]
        return extras
    signature = _signature(func)
    if signature is not None:
        for parameter in signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                found: Mapping[str, Any] = bound.get(parameter.name, {})
                return found
    return {}


def _selected_text(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], lock_keys: object
) -> str:
    """The canonical text of the part of the arguments that identifies the work."""
    if callable(lock_keys):
        chosen = lock_keys(tuple(args), dict(kwargs))
        return chosen if isinstance(chosen, str) else canonical_json(chosen)
    if isinstance(lock_keys, (list, tuple)) and not lock_keys:
        return "{}"  # the task name alone; same text as a call without arguments
    bound = bind_arguments(func, args, kwargs)
    if lock_keys is None:
        return canonical_json(bound)
    if isinstance(lock_keys, (list, tuple)):
        extra = _keyword_extras(func, bound)
        return canonical_json(
            {
                name: bound[name] if name in bound else extra.get(name, _MISSING)
                for name in lock_keys
            }
        )
    raise ValueError(
        f"lock_keys must be None, a callable or a list/tuple of names, not {lock_keys!r}"
    )


def task_lock_key(  # noqa: PLR0917 - the positional order is the task layer's contract
    prefix: str,
    task_name: str,
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    lock_keys: object = None,
    *,
    tag: str | None = None,
) -> str:
    """The lock key for one call: ``{prefix}:{readable task name}:{{{digest}}}``; with a
    ``tag`` (a task with stacked limits: every key of the stack shares it, so one script
    takes them all on Redis Cluster) ``{prefix}:{readable task name}:{digest}:{{{tag}}}``.

    ``lock_keys`` chooses what identifies the work: ``None`` every bound argument; a
    list/tuple of parameter names only those (a name the call did not pass counts as a
    distinct "missing" value); ``()`` the task name alone; a callable
    ``(args_tuple, kwargs_dict) -> str`` whose result is hashed (a non-str result is
    written as canonical JSON first; if it raises, the exception propagates). The
    digest covers the full task name, so names alike in their first 120 characters
    still get different keys.
    """
    text = _selected_text(func, args, kwargs, lock_keys)
    material = _encode_str(task_name) + "\n" + text
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
    if tag is not None:
        return f"{prefix}:{readable_task_name(task_name)}:{digest[:DIGEST_LENGTH]}:{{{tag}}}"
    return f"{prefix}:{readable_task_name(task_name)}:{{{digest[:DIGEST_LENGTH]}}}"

"""A task's key builder: :func:`~celery_singleton_lock.keys.task_lock_key` for one task with
what does not depend on the call worked out once (the signature, the names chosen, their
order, the key's prefix), so a run computes its key without binding the signature again.
It gives exactly the general function's key for every call (a fuzz test compares them) and
takes the general path for any call that does not bind plainly. Imports nothing from
Celery."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_singleton_lock.keys import (
    DIGEST_LENGTH,
    _encode_int,
    _encode_str,
    _Encoder,
    _signature,
    readable_task_name,
    task_lock_key,
)

__all__ = ["KeyBuilder", "canonical_json_item", "key_builder"]

KeyBuilder = Callable[[Sequence[Any], Mapping[str, Any]], str]

_PLAIN_KINDS = frozenset({inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY})


def key_builder(
    prefix: str,
    task_name: str,
    func: Callable[..., Any],
    lock_keys: object = None,
    *,
    tag: str | None = None,
) -> KeyBuilder:
    """``task_lock_key`` for one task, with what does not depend on the call worked out
    once: ``builder(args, kwargs)`` gives the same key as ``task_lock_key(prefix,
    task_name, func, args, kwargs, lock_keys, tag=tag)``. A function of plain parameters
    (no ``*args``/``**kwargs``, no positional-only ones) binds its calls directly; every
    other call, and any call that does not bind plainly, takes the general path."""
    if tag is not None:
        head, tail = f"{prefix}:{readable_task_name(task_name)}:", f":{{{tag}}}"
    else:
        head, tail = f"{prefix}:{readable_task_name(task_name)}:{{", "}"
    material = (_encode_str(task_name) + "\n").encode("utf-8", "surrogatepass")

    def general(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        return task_lock_key(prefix, task_name, func, args, kwargs, lock_keys, tag=tag)

    signature = _signature(func)
    if signature is None or not (lock_keys is None or isinstance(lock_keys, (list, tuple))):
        return general
    parameters = list(signature.parameters.values())
    if any(parameter.kind not in _PLAIN_KINDS for parameter in parameters):
        return general
    names = [parameter.name for parameter in parameters]
    positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    known = frozenset(names)
    chosen = names if lock_keys is None else list(lock_keys)
    if any(name not in known for name in chosen):
        return general  # a name the call may not pass: the general path marks it missing
    # The canonical JSON of the chosen arguments as an object: its keys sorted as
    # ``_encode_mapping`` sorts them (by their tagged, encoded form).
    order = sorted((_encode_str("s:" + name), name) for name in set(chosen))

    def build(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        if len(args) > positional:
            return general(args, kwargs)
        bound = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in bound or name not in known:
                return general(args, kwargs)  # TypeError binding: the fallback form
            bound[name] = value
        if len(bound) < len(names):
            for name in names:
                if name not in bound:
                    if name not in defaults:
                        return general(args, kwargs)
                    bound[name] = defaults[name]
        try:
            items = [f"{encoded}:{canonical_json_item(bound[name])}" for encoded, name in order]
        except RecursionError:
            return general(args, kwargs)
        text = "{" + ",".join(items) + "}"
        digest = hashlib.sha256(material + text.encode("utf-8", "surrogatepass")).hexdigest()
        return head + digest[:DIGEST_LENGTH] + tail

    return build


def canonical_json_item(value: Any) -> str:
    """``canonical_json`` of a value found one level inside a fresh object (an argument of
    a call): the same text its encoding as part of that object gives."""
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return _encode_int(value)
    return _Encoder().encode(value, 1)

"""The lock's steps as flows: generators that yield the Redis calls to make and are sent
their replies, so that acquire, wait, release and extend are written once
(:class:`.steps.LockSteps`) and run by two small runners, a blocking one for ``RedisLock``
and an awaiting one for ``AsyncRedisLock``.

A flow yields an :class:`Op` (call the method of that name on the lock's protocol, or on
the lock itself, with those arguments) or a :class:`Shield` (run this clean-up flow to its
end even if the caller is interrupted meanwhile). The runner sends back what the call
returned, or throws into the flow what it raised. Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any, NamedTuple, Protocol, TypeVar, cast

__all__ = ["Flow", "Op", "Runs", "Shield", "arun", "run", "to_the_end"]

_T = TypeVar("_T")


class Op(NamedTuple):
    """One call a flow asks for: ``method`` of the lock's protocol (of the lock itself
    when ``on_lock``) with ``args``; the flow is sent what it returns."""

    method: str
    args: tuple[Any, ...] = ()
    on_lock: bool = False


class Shield(NamedTuple):
    """A clean-up flow that must run to its end: the asyncio runner awaits it through any
    number of cancellations, then raises the cancellation (``to_the_end``)."""

    flow: Generator[Any, Any, Any]


#: A flow that returns ``_T``.
Flow = Generator[Op | Shield, Any, _T]


class Runs(Protocol):
    """What a runner needs from a lock: its protocol (whose methods most calls are)."""

    protocol: Any


def run(lock: Runs, flow: Flow[_T]) -> _T:
    """Run ``flow`` to its end, making each call it asks for (blocking); a clean-up runs
    like any flow."""
    step: Callable[[Any], Op | Shield] = flow.send
    reply: Any = None
    while True:
        try:
            op = step(reply)
        except StopIteration as stop:
            return cast("_T", stop.value)
        try:
            if isinstance(op, Shield):
                reply = run(lock, op.flow)
            else:
                method, args, on_lock = op
                reply = getattr(lock if on_lock else lock.protocol, method)(*args)
            step = flow.send
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
            reply, step = exc, flow.throw


async def arun(lock: Runs, flow: Flow[_T]) -> _T:
    """``run`` for asyncio: each call is awaited; a clean-up runs to its end however often
    the calling task is cancelled meanwhile (``to_the_end``)."""
    step: Callable[[Any], Op | Shield] = flow.send
    reply: Any = None
    while True:
        try:
            op = step(reply)
        except StopIteration as stop:
            return cast("_T", stop.value)
        try:
            if isinstance(op, Shield):
                reply = await to_the_end(arun(lock, op.flow))
            else:
                method, args, on_lock = op
                reply = await getattr(lock if on_lock else lock.protocol, method)(*args)
            step = flow.send
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
            reply, step = exc, flow.throw


async def to_the_end(cleanup: Coroutine[Any, Any, _T]) -> _T:
    """Run ``cleanup`` to its end, however often the calling task is cancelled meanwhile
    (anyio and Starlette cancel scopes cancel again and again, nested timeouts each once),
    then raise the cancellation if there was one. A bare ``asyncio.shield`` gives up at
    the second cancellation, leaving the clean-up to finish in the background, or never,
    when the event loop ends first: a grant it was giving back would stay held by nobody
    for the whole lease."""
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():  # the clean-up itself was cancelled (the loop is closing)
                raise
            cancelled = exc
            continue
        if cancelled is not None:
            raise cancelled
        return result

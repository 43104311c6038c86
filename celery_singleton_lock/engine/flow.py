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

from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, Protocol, TypeVar, cast

__all__ = ["Flow", "Op", "Runs", "Shield", "arun", "run"]

_T = TypeVar("_T")


class Op(NamedTuple):
    """One call a flow asks for: ``method`` of the lock's protocol (of the lock itself
    when ``on_lock``) with ``args``; the flow is sent what it returns."""

    method: str
    args: tuple[Any, ...] = ()
    on_lock: bool = False


class Shield(NamedTuple):
    """A clean-up flow that must run to its end: the asyncio runner awaits it through any
    number of cancellations, then raises the cancellation (see ``aio._to_the_end``)."""

    flow: Generator[Any, Any, Any]


#: A flow that returns ``_T``.
Flow = Generator[Op | Shield, Any, _T]


class Runs(Protocol):
    """What a runner needs from a lock: how it makes one call (or runs one clean-up)."""

    def _do(self, op: Op | Shield) -> Any: ...


def run(lock: Runs, flow: Flow[_T]) -> _T:
    """Run ``flow`` to its end, making each call it asks for with ``lock._do``."""
    step: Callable[[Any], Op | Shield] = flow.send
    reply: Any = None
    while True:
        try:
            op = step(reply)
        except StopIteration as stop:
            return cast("_T", stop.value)
        try:
            reply, step = lock._do(op), flow.send
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
            reply, step = exc, flow.throw


async def arun(lock: Any, flow: Flow[_T]) -> _T:
    """``run`` for asyncio: each call is awaited (``await lock._do(op)``)."""
    step: Callable[[Any], Op | Shield] = flow.send
    reply: Any = None
    while True:
        try:
            op = step(reply)
        except StopIteration as stop:
            return cast("_T", stop.value)
        try:
            made: Awaitable[Any] = lock._do(op)
            reply, step = await made, flow.send
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
            reply, step = exc, flow.throw

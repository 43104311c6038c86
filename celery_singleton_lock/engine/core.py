"""What ``RedisLock`` and ``AsyncRedisLock`` are, written once: their arguments, their
per-process state and the hold a call is about. What they do (acquire, wait, release,
extend, renew, read) is :mod:`.steps`, also written once; each engine supplies only how a
call is made (blocking or awaited), who the caller is (a thread or an asyncio task), its
local turn-taking and how a hold is renewed. Imports nothing from Celery.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Hashable
from typing import Any, ClassVar, Generic, TypeVar, cast

from celery_singleton_lock.engine import rules
from celery_singleton_lock.engine.holds import Hold, HoldView
from celery_singleton_lock.engine.keyspace import SIGNAL, companion_key
from celery_singleton_lock.engine.stack import Stack
from celery_singleton_lock.engine.wire import socket_timeout

__all__ = ["Client", "LockCore"]

#: The client type of an engine (sync or asyncio).
Client = TypeVar("Client")
#: Attributes of a lock that ``on_key`` does not copy: its key, its state in this process,
#: and the per-key arguments.
_PER_LOCK = frozenset(
    {
        "name",
        "claim",
        "stack",
        "signal_key",
        "checks_finished",
        "_unless_finished",
        "_given_info",
        "_fixed_token",
        "_mutex",
        "_reservation",
        "_pid",
        "_holds",
        "_contended",
        "holder_info",
        "protocol",
    }
)
#: A lock class (``owner_of`` gives one of the caller's own class).
_Lock = TypeVar("_Lock", bound="LockCore[Any]")


class LockCore(HoldView, Generic[Client]):
    """What a lock is, for both engines (see ``RedisLock`` for the arguments). An engine
    provides ``_me`` (the caller: a thread or a task), ``_holder_alive``, ``_wire`` (its
    protocol), ``_setup`` (its own state), ``_stop_renewal`` and ``_check_engine`` (what it
    refuses); :class:`.steps.LockSteps` adds what the lock does."""

    #: How the class and its caller are named in messages.
    _kind: ClassVar[str]
    _caller: ClassVar[str]
    _mutex: Any  # guards _holds (a renewer thread reads holds too); a no-op in asyncio
    _reservation: Any  # the local turn of a fixed-token owner's threads or tasks

    def __init__(
        self,
        client: Client,
        name: str,
        timeout: float = 30.0,
        *,
        auto_renew: bool = False,
        scripting: bool = True,
        fallback_poll: float = 1.0,
        token: str | None = None,
        claim: str | None = None,
        holder_info: str | dict[str, Any] | None = None,
        limit: int = 1,
        group: str | None = None,
        replicas: int = 0,
        replicas_timeout: float = 0.5,
        fair_after: float | None = None,
        stack: Stack | None = None,
        unless_finished: str | None = None,
    ) -> None:
        self._check_engine(client, scripting)
        self._fair_ms = rules.fair_ms(fair_after, scripting=scripting)
        self._lease_ms = rules.check_lock(
            name,
            timeout,
            scripting=scripting,
            fallback_poll=fallback_poll,
            token=token,
            claim=claim,
            limit=limit,
            group=group,
        )
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas < 2**63:
            raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
        self._replicas_timeout_ms = rules.lease_ms(replicas_timeout, "replicas_timeout")
        self.scripting = scripting
        self._check_stack(name, stack)
        self.client = client
        self.name = name
        self.timeout = float(timeout)
        self.auto_renew = auto_renew
        self.fallback_poll = float(fallback_poll)
        self._cap: float | None = None
        self.claim = claim or ""
        self.limit = limit
        self.group = group or ""
        self.replicas = replicas
        self.replicas_timeout = float(replicas_timeout)
        self.fair_after = fair_after
        self.stack = stack
        #: The stacked limit that held back this instance's last failed try (its key was
        #: free), None when the key itself was held or there is no stack.
        self.held_back_by: str | None = None
        #: ``unless_finished``: a task id whose finished run (a record in the key's done set,
        #: written by a release with ``record=``) makes an acquire take nothing, checked in
        #: the acquire's own step (scripting only: ``checks_finished`` says whether it is).
        self._set_unless_finished(unless_finished)
        #: The last acquire found that run finished (and took nothing).
        self.found_finished = False
        self.signal_key = companion_key(name, SIGNAL)
        self._fixed_token = token
        self._given_info = holder_info
        self._setup()
        self._start_process()

    def _check_stack(self, name: str, stack: Stack | None) -> None:
        if stack is not None:
            if not self.scripting:
                raise ValueError("stack needs scripting=True (its shares are taken by a script)")
            stack.check_lock(name)

    def _set_unless_finished(self, unless_finished: str | None) -> None:
        if unless_finished is not None and not isinstance(unless_finished, str):
            raise ValueError(f"unless_finished must be a task id (str), got {unless_finished!r}")
        self.checks_finished = bool(unless_finished) and self.scripting
        self._unless_finished = (unless_finished or "") if self.scripting else ""

    def on_key(
        self: _Lock,
        name: str,
        *,
        token: str | None = None,
        claim: str | None = None,
        holder_info: str | dict[str, Any] | None = None,
        stack: Stack | None = None,
        unless_finished: str | None = None,
    ) -> _Lock:
        """A new lock on key ``name``, with this one's client, lease and every other
        argument (checked once, when this one was built) and the given per-key ones: what
        a task builds for each run without validating its options again. It shares no
        state with this one: it holds nothing and has its own owner tokens."""
        base = rules.check_name(name)
        rules.check_token("token", token)
        rules.check_token("claim", claim)
        lock = object.__new__(type(self))
        lock.__dict__.update(self._template)
        lock.name = name
        lock._fixed_token = token
        lock.claim = claim or ""
        lock._check_stack(name, stack)
        lock.stack = stack
        lock._set_unless_finished(unless_finished)
        lock.signal_key = base + SIGNAL
        lock._given_info = holder_info
        lock._setup()
        lock._start_process()
        return lock

    @property
    def _template(self) -> dict[str, Any]:
        """The attributes a lock built by ``on_key`` starts from: this lock's arguments and
        what was worked out from them, none of its state."""
        found: dict[str, Any] | None = self.__dict__.get("_template_attrs")
        if found is None:
            self._poll_cap()  # the client's, so worked out once for every lock built here
            found = {
                name: value
                for name, value in self.__dict__.items()
                if name not in _PER_LOCK and not name.startswith("_template")
            }
            found.update(held_back_by=None, found_finished=False)
            self.__dict__["_template_attrs"] = found
        return found

    def _setup(self) -> None:
        """The engine's own state, set up once the arguments are checked."""

    def _check_engine(self, client: Client, scripting: bool) -> None:
        """Refuse what this engine cannot do (``ValueError`` / ``TypeError``)."""

    def _start_process(self) -> None:
        """Per-process state: set up at construction and again in a forked child, which
        holds nothing its parent held."""
        self._pid = os.getpid()
        self._holds: dict[Hashable, Hold] = {}
        # A caller whose last acquire failed while others held this instance: the holds it
        # contended with, which it never speaks for.
        self._contended: weakref.WeakKeyDictionary[Any, tuple[Hold, ...]] | None = None
        self.holder_info = rules.holder_text(self._given_info, self._pid)
        self.protocol = self._wire(
            self.name,
            self.signal_key,
            self.holder_info,
            limit=self.limit,
            group=self.group,
            fair_ms=self._fair_ms,
            stack=self.stack,
            unless_finished=self._unless_finished,
        )

    def _wire(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def owner_of(self: _Lock, token: str) -> _Lock:
        """A lock of the same key, client, protocol and slots that acts for the hold under
        owner ``token`` (one this instance did not take): to release, extend or claim it."""
        return type(self)(
            self.client, self.name, token=token, scripting=self.scripting, limit=self.limit
        )

    def __repr__(self) -> str:
        token = self.token
        shown = f"{token[:8]}…" if token else None
        return f"<{self._kind} {self.name!r} token={shown} fence={self.fencing_token}>"

    # -- the hold a call is about ---------------------------------------------------------

    def _me(self) -> Hashable | None:
        raise NotImplementedError

    def _holder_alive(self, hold: Hold) -> bool:
        raise NotImplementedError

    def _own_hold(self, me: Hashable) -> Hold | None:
        """The caller's hold in this process (forgetting a parent's after fork)."""
        if not self._holds and self._pid == os.getpid():
            return None  # a lock that holds nothing here (a run's fresh lock)
        with self._mutex:
            if self._pid != os.getpid():
                self._start_process()
            return self._holds.get(me)

    def _hold(self) -> Hold | None:
        """The caller's hold; else the only hold of this instance in this process, unless
        the caller contended with that very hold (``rules.hold_for``)."""
        if self._pid == os.getpid():  # the common case: the caller's own hold, read as is
            me = self._me()
            if me is not None:
                mine = self._holds.get(me)
                if mine is not None:
                    return mine
        with self._mutex:
            if self._pid != os.getpid():
                self._start_process()
            me = self._me()
            if me is None:
                return rules.hold_for(None, self._holds.values(), (), self._holder_alive)
            contended = self._contended.get(me, ()) if self._contended is not None else ()
            return rules.hold_for(
                self._holds.get(me), self._holds.values(), contended, self._holder_alive
            )

    def _end(self, hold: Hold, *, keep_turn: bool = False) -> None:
        """Forget ``hold`` locally: its renewal stops and, unless ``keep_turn``, a waiting
        caller of a fixed-token owner may take its turn."""
        with self._mutex:
            hold.ended = True
            for me, held in self._holds.items():
                if held is hold:  # a hold is recorded under one caller
                    del self._holds[me]
                    break
        self._stop_renewal(hold)
        if not keep_turn:
            self._end_turn(hold)

    def _stop_renewal(self, hold: Hold) -> None:
        """Stop renewing ``hold`` now (a renewer thread drops ended holds on its own)."""

    def _end_turn(self, hold: Hold) -> None:
        """Let the next caller of a fixed-token owner take its turn."""
        if hold.reserved:
            hold.reserved = False
            self._reservation.release()

    @property
    def lease_lost(self) -> bool:
        """True once the hold can no longer be trusted: renewal found the lock gone, or the
        lease's deadline passed with no confirmed renewal. Judged by the local clock from
        the last confirmed lease, so a stalled connection cannot delay it."""
        hold = self._hold()
        return hold is not None and hold.lost_by(time.monotonic())

    def ensure_held(self) -> None:
        """Raise ``LockLost`` when the caller's hold can no longer be trusted (see
        ``lease_lost``), ``LockNotOwned`` when it holds nothing; a check that costs no round
        trip, for long work to call between steps."""
        rules.ensure_held(self._hold(), self.name)

    def detach(self) -> None:
        """Stop renewing and forget the hold locally, without releasing it: the lock stays
        with whoever has its owner token (e.g. a queued task message) until it expires."""
        hold = self._hold()
        if hold is not None:
            self._end(hold)

    def slot_key(self, number: int) -> str:
        """The key of slot ``number`` (1 .. ``limit``): the lock key, or ``<base>slot:<i>``."""
        return rules.slot_key(self.name, number)

    def slot_keys(self) -> list[str]:
        """The keys of this lock's slots: the lock key, then ``<base>slot:<i>`` (names only:
        ``limit`` of them; nothing is read)."""
        return [self.slot_key(i) for i in range(1, self.limit + 1)]

    def _poll_cap(self) -> float:
        """The longest single block (``rules.poll_cap``: the fallback poll, never near the
        client's socket timeout), worked out once per instance."""
        if self._cap is None:
            timeout = socket_timeout(cast("Any", self.client))  # sync or asyncio
            self._cap = rules.poll_cap(self.fallback_poll, timeout)
        return self._cap

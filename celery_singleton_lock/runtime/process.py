"""Processes of this host as holds name them, and whether one is gone.

"Gone" needs more than a host name and a pid: containers started with a fixed hostname, or
pods on the host network, share a hostname but not a PID namespace, so the same pid there
is another process. A hold names its process by boot id, PID namespace, pid and start time
(``proc`` in its holder info). Only a process of this very boot and namespace can be
judged here; a pid that lives on with another start time was reused. Everything else is
unknown, and the lease decides.
"""

from __future__ import annotations

import os
import socket
from typing import Literal

__all__ = ["HOST", "ProcessState", "process_identity", "process_state"]

HOST = socket.gethostname()

ProcessState = Literal["gone", "running"] | None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as found:
            return found.read().decode("ascii", "backslashreplace").strip()
    except OSError:
        return None


def _stat(pid: int | str) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process ``pid``, from /proc."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


_BOOT = _read("/proc/sys/kernel/random/boot_id")


_identity: tuple[int, str | None] = (0, None)


def process_identity() -> str | None:
    """This process as a hold names it: ``boot id/PID namespace/pid/start time`` (None
    where /proc cannot say, e.g. not on Linux). Read once per process."""
    global _identity  # noqa: PLW0603 - one reading per process (a forked child reads again)
    pid = os.getpid()
    if _identity[0] != pid:
        stat, namespace = _stat(pid), _namespace("self")
        known = _BOOT is not None and stat is not None and namespace is not None
        _identity = (pid, f"{_BOOT}/{namespace}/{pid}/{stat[1]}" if known and stat else None)
    return _identity[1]


def process_state(info: dict[str, object]) -> ProcessState:
    """The process a hold's holder info names: ``"gone"`` (of this boot and PID namespace,
    and no such process runs now: exited, a zombie, or its pid reused by a process that
    started later), ``"running"`` (it still runs here), or None when this process cannot
    tell (another host, another boot or namespace, a hold without ``proc``)."""
    if info.get("host") != HOST:
        return None
    parts = str(info.get("proc") or "").split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    boot, namespace, pid, started = parts
    if _BOOT is None or boot != _BOOT or namespace != _namespace("self"):
        return None
    stat = _stat(pid)
    if stat is None:
        return "gone" if not os.path.exists(f"/proc/{pid}") else None
    state, start = stat
    return "gone" if state in ("Z", "X") or start != started else "running"

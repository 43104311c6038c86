"""``FaultProxy``: a loopback TCP proxy whose connections a test can stall, resume or
cut, as a network between a client and Redis would."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["FaultProxy"]


class FaultProxy:
    """A loopback TCP proxy in front of ``127.0.0.1:<upstream_port>`` whose connections a
    test can stall (they stay open and nothing flows, either way), resume, or cut (every
    open connection closed at once), as a network between a client and Redis would.
    Point a client at ``url`` (or ``port``); a context manager."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._mutex = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stall(self) -> None:
        """Hold every byte in both directions until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        """Let bytes flow again."""
        self._flowing.set()

    def cut(self) -> int:
        """Close every open connection (new ones are still accepted); how many were cut."""
        with self._mutex:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(sockets) // 2

    def close(self) -> None:
        """Stop accepting and cut everything."""
        self._closed = True
        self._flowing.set()
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._mutex:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                while not self._flowing.wait(0.1):
                    if self._closed or sink.fileno() < 0:
                        return  # closed or cut while stalled
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""A TCP forwarder that can be shut and opened again on the same port: a store outage as its
clients see one (connection refused, connections dropped), in front of a real server."""

from __future__ import annotations

import selectors
import socket
import threading
from types import TracebackType

from ports import unused_port


class TcpGate:
    """Forward ``127.0.0.1:<port>`` to ``target``; :meth:`shut` refuses and drops connections
    until :meth:`open`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        # Below the kernel's ephemeral range: no outgoing connection takes it while shut.
        self.port = unused_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        """Listen again (on the same port) and forward what connects."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        """Stop listening (new connections are refused) and drop every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._connections += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(a, selectors.EVENT_READ, b)
            selector.register(b, selectors.EVENT_READ, a)
            try:
                while True:
                    for key, _ in selector.select():
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        key.data.sendall(data)
            except (OSError, ValueError):
                return  # dropped by shut()
            finally:
                a.close()
                b.close()

    def __enter__(self) -> TcpGate:
        self.open()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shut()

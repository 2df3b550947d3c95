"""A TCP proxy the fault tests control: 127.0.0.1:port -> a target (the PostgreSQL server).

- ``down()`` cuts every connection and refuses new ones (the database host went away);
  ``up()`` serves again on the same port.
- ``silence()`` keeps every connection open but forwards no byte either way (a database
  host that hangs, or a network that drops packets); ``speak()`` forwards again, what was
  held included.
"""

from __future__ import annotations

import socket
import threading

from tests.integration.conftest import free_port

__all__ = ["TcpProxy"]


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.flowing = threading.Event()
        self.flowing.set()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        self.flowing.set()  # a pump held by silence() must not outlive its sockets
        with self._lock:
            if self._listener is not None:
                # Without shutdown() a thread blocked in accept() keeps it listening (Linux).
                _shutdown(self._listener)
                self._listener.close()
                self._listener = None
            for sock in self._sockets:
                _shutdown(sock)
                sock.close()
            self._sockets.clear()

    def silence(self) -> None:
        self.flowing.clear()

    def speak(self) -> None:
        self.flowing.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass

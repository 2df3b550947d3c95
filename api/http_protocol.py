"""uvicorn's HTTP/1.1 protocol with TCP_NODELAY set on every connection.

With ``--workers`` above one, uvicorn binds the listening socket itself, with protocol
number 0, and asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP. A
response written in two sends (head, then body) then waits for the client's delayed ACK
(Nagle's algorithm): about 45 ms added to every keep-alive request. Measured on loopback,
sequential GETs of one hardware profile: p50 48 ms with two workers before, 2.1 ms with
this protocol; one worker was not affected (asyncio binds that socket itself).

Kept in a module of its own: uvicorn pickles its configuration, this class included, into
each worker process, so the class must be importable by name.
"""

from __future__ import annotations

import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["NoDelayH11Protocol"]


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)

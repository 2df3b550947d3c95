"""Two server processes on one socket answer keep-alive requests without the ~45 ms each
that Nagle's algorithm and the client's delayed ACK once added (issue 16, item 8): uvicorn
binds the shared socket with protocol number 0, on which asyncio does not set TCP_NODELAY,
so each process sets it on its connections (api.http_protocol)."""

from __future__ import annotations

import socket
import time

import httpx

from api.http_protocol import NoDelayH11Protocol


def test_two_workers_answer_keep_alive_requests_without_a_delayed_ack(start_server, tmp_path):
    server = start_server(
        f"sqlite:///{tmp_path / 'workers.db'}",
        workers=2,
        env={"STAGEWRIGHT_SEARCH_PROCESSES_AT_START": "false"},
    )
    times = []
    with httpx.Client(base_url=server.url, timeout=30) as http:  # one keep-alive connection
        for _ in range(60):
            started = time.perf_counter()
            assert http.get("/v1/hardware/cpu").status_code == 200
            times.append(time.perf_counter() - started)
    # With the delayed ACK every answer waited at least 40 ms (Linux's minimum ACK delay);
    # a busy machine makes some answers slow, but not every one.
    assert min(times) < 0.03, sorted(times)[:5]
    assert "died" not in server.log_path.read_text()  # no process was killed and replaced


def test_the_protocol_sets_tcp_nodelay_on_each_connection():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)  # protocol 0, as uvicorn
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0

        class Transport:
            def get_extra_info(self, name: str) -> object:
                return accepted if name == "socket" else None

        protocol = NoDelayH11Protocol.__new__(NoDelayH11Protocol)
        try:
            protocol.connection_made(Transport())  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - only the socket option matters here
            pass
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        for sock in (client, accepted, listener):
            sock.close()

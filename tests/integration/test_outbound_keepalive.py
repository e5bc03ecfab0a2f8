"""The outbound client's kept-alive connections against a receiver PROCESS: a host keeps
as many as it had calls in flight at once; and when the receiver is killed and started
again on the same port, a connection the dead process held is stale, and the next POST
must go out on a fresh connection and be answered by the new process, not be counted as
a failed attempt (each failed attempt costs a webhook a scheduled retry)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from services.kit.addresses import AddressPolicy
from services.kit.outbound import OutboundClient, OutboundPolicy

# A keep-alive HTTP/1.1 server answering every POST with 200 and its own pid.
RECEIVER = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        body = str(os.getpid()).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

ThreadingHTTPServer.allow_reuse_address = True
server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.fixture
def receivers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _client() -> OutboundClient:
    policy = OutboundPolicy(
        addresses=AddressPolicy.allowing(["127.0.0.0/8"]), allow_http=True, timeout_seconds=5
    )
    return OutboundClient(policy)


@pytest.mark.parametrize("kept", [1, 4])
async def test_connections_kept_to_a_killed_receiver_are_replaced_not_failed(
    receivers: list[subprocess.Popen[str]], kept: int
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    client = _client()
    try:
        receivers.append(_start(port))
        # ``kept`` connections in the pool, all to the first process.
        first = await asyncio.gather(*(client.post(url, [], b"{}") for _ in range(kept)))
        assert {answer.body for answer in first} == {str(receivers[0].pid).encode()}
        assert client.connections_opened == kept

        receivers[0].kill()  # SIGKILL: its sockets are reset, the client is not told
        receivers[0].wait()
        receivers.append(_start(port))

        # Every kept connection is dead; each POST still reaches the new process.
        for _ in range(kept + 1):
            answer = await client.post(url, [], b"{}")
            assert answer.status == 200
            assert answer.body == str(receivers[1].pid).encode()
        assert client.connections_opened == kept + 1
    finally:
        await client.close()


async def test_a_receiver_that_closes_an_idle_connection_is_not_a_failed_attempt(
    receivers: list[subprocess.Popen[str]],
) -> None:
    """Stopped (SIGTERM-like close of the listening process) and started again: the same."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    client = _client()
    try:
        receivers.append(_start(port))
        await client.post(url, [], b"{}")
        receivers[0].terminate()
        receivers[0].wait()
        receivers.append(_start(port))
        answer = await client.post(url, [], b"{}")
        assert answer.body == str(receivers[1].pid).encode()
        assert client.connections_opened == 2
    finally:
        await client.close()


async def test_a_host_keeps_as_many_connections_as_it_had_calls_in_flight(
    receivers: list[subprocess.Popen[str]],
) -> None:
    """Bursts wider than the policy's keep_alive (16) reuse the burst's connections: the
    deliverer sends an endpoint up to its max_in_flight at once."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    client = _client()
    try:
        receivers.append(_start(port))
        for _ in range(3):
            answers = await asyncio.gather(*(client.post(url, [], b"{}") for _ in range(40)))
            assert {answer.status for answer in answers} == {200}
        assert client.connections_opened == 40
    finally:
        await client.close()

"""Anchors for the benchmarks: what the machine does with no atelier code in the way.

A figure of ours means little on a shared 2-vCPU machine unless it is measured beside
the same work done the plainest possible way, in the same run. The echo anchor is a bare
grpc.aio server in its own process (as each service is) answering a unary call with the
bytes it got: the floor under any RPC of ours.

    .venv/bin/python bench/anchors.py echo-server --port 50999   # used by the benches
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from services.dev.processes import free_port

ECHO_METHOD = "/bench.Echo/Call"


async def _serve_echo(port: int) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """A bare grpc.aio echo server in its own process; yields its address."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "echo-server", "--port", str(port)]
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the echo server did not start")
            time.sleep(0.05)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=10)


def echo_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(ECHO_METHOD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["echo-server"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_echo(args.port))


if __name__ == "__main__":
    main()

"""Child processes of a local stack: start, wait until ready, stop in order."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Ports handed out by this process, so two callers never get the same one.
_handed_out: set[int] = set()


def _below_ephemeral_range() -> tuple[int, int]:
    """Ports the kernel never gives to outgoing connections: a port chosen there stays free
    until the child we start binds it (one from the ephemeral range may meanwhile become the
    local end of some connection to PostgreSQL)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 20000, max(20000 + 1000, low - 1)


# Several processes choosing ports at once (test workers side by side) each take theirs
# from a share of the range, "index/count", so none can hand out a port another chose and
# has not bound yet.
PORT_SHARE_VARIABLE = "ATELIER_FREE_PORT_SHARE"


def _port_range() -> tuple[int, int]:
    low, high = _below_ephemeral_range()
    share = os.environ.get(PORT_SHARE_VARIABLE)
    if not share:
        return low, high
    index, count = (int(part) for part in share.split("/"))
    # Bounds at floor(k * whole / count): the parts of a share (sub_share) tile it exactly.
    whole = high - low + 1
    return low + index * whole // count, low + (index + 1) * whole // count - 1


def sub_share(share: str | None, slot: int, slots: int) -> str:
    """The ``slot``-th of ``slots`` equal parts of ``share`` ("index/count"; None: the
    whole range), for children that choose their ports side by side (benches a test
    worker runs at once)."""
    index, count = (int(part) for part in (share or "0/1").split("/"))
    return f"{index * slots + slot}/{count * slots}"


def free_port() -> int:
    low, high = _port_range()
    for _ in range(500):
        port = random.randint(low, high)  # noqa: S311 (a port, not a secret)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {low} and {high}")


def venv_binary(name: str) -> str:
    """A console script installed beside this interpreter (envoy, grpcurl, buf)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run `make dev` or `make venv`")
    return found


class StartupError(RuntimeError):
    """A child process died or never became ready."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_dir: Path | None) -> Child:
    """Starts a child. With ``log_dir`` its output goes to ``<log_dir>/<name>.log``
    (appended: a service started again keeps its earlier lines); without, it shares this
    terminal."""
    output: IO[bytes] | None = None
    log_path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        output = log_path.open("ab")
    # A new session: Ctrl-C in the terminal reaches the launcher only, which then stops
    # the children in order.
    process = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
        start_new_session=True,
    )
    if output is not None:
        output.close()
    return Child(name, process, log_path)


def wait_until(child: Child, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise StartupError(
                f"{child.name} exited with {child.process.returncode}\n{child.log_tail()}"
            )
        if ready():
            return
        time.sleep(0.1)
    raise StartupError(f"{child.name} was not ready within {timeout:g}s\n{child.log_tail()}")


def grpc_serving(address: str) -> Callable[[], bool]:
    def check() -> bool:
        with grpc.insecure_channel(address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    return check


def accepting(port: int) -> Callable[[], bool]:
    """True once something accepts TCP connections on 127.0.0.1:``port``."""

    def check() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            return False

    return check


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - our own localhost URL
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    return check

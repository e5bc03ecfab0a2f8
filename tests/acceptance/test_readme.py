"""The README's commands paste and work as is: each ```sh block that talks to a running
system runs in bash, in order, as one terminal session, against a real stack as `make dev`
runs it — the job engine with the stub provider at its default pace — (its ports in place
of the defaults the README shows), from a folder laid out like the repository. A new user
following it sees the job's states and downloads a real picture."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image, ImageChops, ImageOps

from services.dev.processes import free_port
from services.dev.stack import Stack
from tests.support.cli import wait_serving
from tests.support.stacks import stack_of_its_own

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def commands(block: str) -> list[str]:
    """The block's commands, without comments and with continuations joined."""
    joined = block.replace("\\\n", " ")
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")
    ]


def test_the_first_commands_are_make_dev_and_make_test() -> None:
    first = commands(readme_blocks()[0])
    assert [c.split("#")[0].strip() for c in first] == ["make dev", "make test"]


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    """A folder laid out like the repository (.venv, gen) holding a JPEG at photo.jpg."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "gen").symlink_to(ROOT / "gen")
    photo = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 120, 40)).save(photo, "JPEG")
    (tmp_path / "photo.jpg").write_bytes(photo.getvalue())
    return tmp_path


def on_stack(text: str, stack: Stack) -> str:
    """The README's default addresses, pointed at this stack's ports."""
    for default, actual in (
        ("127.0.0.1:8080", stack.ports.envoy),
        ("127.0.0.1:50051", stack.ports.public["creation"]),
        ("127.0.0.1:50061", stack.ports.internal["creation"]),
    ):
        text = text.replace(default, f"127.0.0.1:{actual}")
    return text


def user_env() -> dict[str, str]:
    """This environment with the virtual environment off PATH, as in a user's shell
    (make puts it on PATH; a bare `grpcurl` would pass here and fail there)."""
    venv_bin = str(ROOT / ".venv" / "bin")
    path = ":".join(p for p in os.environ["PATH"].split(":") if p != venv_bin)
    return {**os.environ, "PATH": path}


@pytest.fixture(scope="module")
def dev_stack(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack as `make dev` runs it (creation with its job engine, every setting at its
    development default), on a database of its own: the README's user "me" starts fresh."""
    work = tmp_path_factory.mktemp("readme")
    with stack_of_its_own(postgres_admin_url, work, "all", {}) as stack:
        yield stack


def test_readme_commands_run_against_a_running_stack(dev_stack: Stack, session_dir: Path) -> None:
    stack = dev_stack
    live = [b for b in readme_blocks() if re.search(r"127\.0\.0\.1:(8080|50051|50061)", b)]
    assert len(live) == 3
    script = "set -euo pipefail\n" + "\n".join(on_stack(b, stack) for b in live)
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=session_dir,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # No answer was an error (every google.rpc.Status through the edge carries details).
    assert '"details"' not in out and "ERROR" not in result.stderr, out + result.stderr
    for expected in [
        '"modelId":"stub-fast"',  # curl through the edge
        "atelier.creation.v1.CreationService\n",  # grpcurl list
        "atelier.media.v1.MediaService\n",  # grpcurl list through the edge
        "// Submits a generation job.",  # grpcurl describe, with the proto comment
        '"model_id": "stub-fast"',  # grpcurl over reflection (proto field names)
        '"modelId": "stub-fast"',  # grpcurl through the edge with the descriptor set
        '"status":"ASSET_STATUS_READY"',  # the upload, completed
        '"cancelRequested":true',  # the second job, cancelled
        '"availablePoints"',  # GrantPoints' answer and the balance
    ]:
        assert expected in out, f"{expected!r} not in:\n{out}"

    # The first job, followed: queued, running with its progress, then succeeded.
    states = re.findall(r'"status":"JOB_STATUS_(\w+)"(?:,"step":"JOB_STEP_(\w+)")?', out)
    seen = [status for status, _ in states]
    first_end = seen.index("SUCCEEDED")
    assert seen[0] == "QUEUED" and "RUNNING" in seen[:first_end], out
    assert re.search(
        r'"status":"JOB_STATUS_RUNNING","step":"JOB_STEP_GENERATING","progressPercent":[1-9]', out
    ), out
    # The picture downloads: the size the job asked for (512x512, from a 64x48 photo),
    # restyled.
    styled = Image.open(session_dir / "styled.jpg")
    photo = ImageOps.fit(Image.open(session_dir / "photo.jpg").convert("RGB"), (512, 512))
    assert (styled.format, styled.size) == ("JPEG", (512, 512))
    assert ImageChops.difference(styled.convert("RGB"), photo).getbbox() is not None
    # The second job ends cancelled; both show in the list.
    assert "CANCELLED" in seen[first_end:], out
    # Captured once for the first job, released for the second: 95 of 100 left, none held.
    assert out.count('{"availablePoints":95,"reservedPoints":0,') >= 2, out
    # Where the points went: the welcome grant, two reserves, a capture and a release.
    kinds = re.findall(r'\{"kind":"LEDGER_ENTRY_KIND_(\w+)"', out)
    assert sorted(kinds) == ["CAPTURE", "GRANT", "RELEASE", "RESERVE", "RESERVE"], out


def test_readme_serves_one_service_with_real_secrets(database_url: str, session_dir: Path) -> None:
    """The external-PostgreSQL block, with this session's database as "your PostgreSQL":
    it migrates, then serves as a production process until stopped."""
    (block,) = [b for b in readme_blocks() if "atelier serve creation" in b]
    script = re.sub(r"ATELIER_DATABASE_URL=\S+", f"ATELIER_DATABASE_URL={database_url}", block)
    ports = {
        f"ATELIER_CREATION_{k}_PORT": str(free_port()) for k in ("PUBLIC", "INTERNAL", "METRICS")
    }
    env = {k: v for k, v in user_env().items() if k != "ATELIER_ENV"}
    process = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=session_dir,
        env={**env, **ports},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_serving(process, f"127.0.0.1:{ports['ATELIER_CREATION_PUBLIC_PORT']}")
    finally:
        # The block ends in the server, in the foreground: Ctrl-C's signal, to its group.
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
    logs = process.stderr.read() if process.stderr else ""
    assert "migrated creation" in logs
    assert '"service_stopped"' in logs

"""The TypeScript client (clients/typescript/) against the whole stack through Envoy:
its own tests run in Node (`node --test`), the hand-written layer's unit tests and its
acceptance test (upload -> submit -> watch -> download -> cancel -> list, WatchJobs
resumed from a cursor), built with the pinned TypeScript from `make node-deps`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, png
from tests.support.stacks import stack_of_its_own

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"
# Each Node test file and how many tests it holds: none may be skipped or missing.
NODE_TESTS = {"unit.test.js": 10, "acceptance.test.js": 4}


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("typescript")
    env = {
        # Long enough for a cancel to reach a running job before it finishes.
        "ATELIER_STUB_DURATION": "3",
        "ATELIER_HEARTBEAT": "0.5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    }
    with stack_of_its_own(postgres_admin_url, work, "all", env) as stack:
        yield stack


def built(out: Path) -> Path:
    """The client and its tests compiled into ``out`` (not into the source tree, which
    another run may be reading), beside a link to its node_modules."""
    node = shutil.which("node")
    assert node, "Node is missing: `make node-deps` installs it"
    assert (CLIENT / "node_modules" / "typescript").is_dir(), "run `make node-deps` first"
    tsc = CLIENT / "node_modules" / "typescript" / "bin" / "tsc"
    compiled = subprocess.run(
        [node, str(tsc), "-p", str(CLIENT / "tsconfig.json"), "--outDir", str(out / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    (out / "node_modules").symlink_to(CLIENT / "node_modules")
    return out / "dist" / "test"


def test_the_typescript_client_runs_against_the_stack_through_envoy(
    running: Stack, tmp_path: Path
) -> None:
    tests = built(tmp_path)
    picture = tmp_path / "input.png"
    picture.write_bytes(png())
    env = {
        **os.environ,
        "ATELIER_EDGE_URL": f"http://127.0.0.1:{running.ports.envoy}",
        "ATELIER_TOKEN": User().token,
        "ATELIER_TEST_PNG": str(picture),
    }
    ran = subprocess.run(
        [shutil.which("node") or "node", "--test", *(str(tests / name) for name in NODE_TESTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    report = ran.stdout + ran.stderr
    assert ran.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|skipped|cancelled|todo) (\d+)$", report, re.M))
    assert counts == {
        "pass": str(sum(NODE_TESTS.values())),
        "fail": "0",
        "skipped": "0",
        "cancelled": "0",
        "todo": "0",
    }, report

"""`atelier dev`'s APNs wiring: the stack starts the local APNs peer and notify's sender
sends to it, so a push written into notify.pushes shows up in the peer's output; and
`atelier push doctor`, run beside it from a shell that sets nothing, checks that stack
(its database and its peer) and passes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev import apns_peer, postgres
from services.dev.stack import Stack, StackPorts
from services.kit.db import asyncpg_url
from tests.support.cli import ATELIER

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def database(postgres_admin_url: str) -> Iterator[str]:
    name = f"atelier_apns_{uuid.uuid4().hex[:10]}"
    url = postgres.ensure_database(postgres_admin_url, name)
    yield url
    postgres.drop_database(postgres_admin_url, name)


@pytest.fixture
async def engine(database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(database))
    yield engine
    await engine.dispose()


@pytest.fixture(scope="module")
def stack(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work_dir = tmp_path_factory.mktemp("dev-stack")
    stack = Stack(
        database_url=database,
        ports=StackPorts.free(),
        work_dir=work_dir,
        log_dir=work_dir / "logs",
        apns_peer=True,
    )
    stack.migrate()
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def test_the_dev_stack_sends_pushes_to_its_local_apns_peer(
    stack: Stack, engine: AsyncEngine
) -> None:
    token = "ab" * 32
    token_id = uuid.uuid4()
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO notify.push_tokens (token_id, user_id, kind, token, environment,"
                " bundle_id, locale, registered_at) VALUES (:id, 'dev-user', 'device', :token,"
                " 'sandbox', :bundle, 'en', now())"
            ),
            {"id": token_id, "token": token, "bundle": apns_peer.DEV_BUNDLE_ID},
        )
        push_id = await connection.scalar(
            text(
                "INSERT INTO notify.pushes (token_id, job_id, version, kind, priority, headers,"
                " payload, next_attempt_at, created_at) VALUES (:id, :job, 1, 'alert', 10,"
                " CAST(:headers AS jsonb), CAST(:payload AS jsonb), now(), now())"
                " RETURNING push_id"
            ),
            {
                "id": token_id,
                "job": uuid.uuid4(),
                "headers": json.dumps(
                    {
                        "apns-push-type": "alert",
                        "apns-topic": apns_peer.DEV_BUNDLE_ID,
                        "apns-priority": "10",
                    }
                ),
                "payload": json.dumps({"aps": {"alert": {"title": "Picture ready"}}}),
            },
        )
    async with asyncio.timeout(20):
        while True:
            async with engine.connect() as connection:
                status = await connection.scalar(
                    text("SELECT status FROM notify.pushes WHERE push_id = :id"),
                    {"id": push_id},
                )
            if status != "pending":
                break
            await asyncio.sleep(0.1)  # the sender's poll: nothing to await across processes

    assert status == "sent"
    peer_output = (stack.work_dir / "logs" / "apns-peer.log").read_text()
    [line] = [json.loads(x) for x in peer_output.splitlines() if "apns_peer_push" in x]
    assert line["payload"] == {"aps": {"alert": {"title": "Picture ready"}}}
    assert line["device"] == "…" + token[-8:]
    assert token not in peer_output


def test_the_push_doctor_beside_the_dev_stack_checks_it_and_passes(stack: Stack) -> None:
    # A new terminal under `make dev`: no ATELIER_* setting at all (ATELIER_DEV_DIR only
    # says where this stack keeps its state, `var/` under `make dev`).
    shell = {k: v for k, v in os.environ.items() if not k.startswith("ATELIER_")}
    done = subprocess.run(
        [*ATELIER, "push", "doctor"],
        env={**shell, "ATELIER_DEV_DIR": str(stack.work_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    assert any(line.startswith("ok   settings: from the running `atelier dev`") for line in lines)
    registered = [line for line in lines if "registered tokens" in line]
    assert registered and all(line.startswith("ok ") for line in registered)
    for environment in ("sandbox", "production"):
        [line] = [x for x in lines if f"credentials ({environment})" in x]
        assert line.startswith("ok ") and "400 BadDeviceToken" in line

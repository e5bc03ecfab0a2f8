"""Issue 25, point 1, over the whole stack with every part a real process: creation (API
only, so jobs stay queued) with its outbox relay, notify's Deliver and APNs sender, Envoy,
and the local HTTP/2 APNs peer checking each request as Apple does. Users cancel a queued
job and delete it at once, through the edge, several jobs side by side: each owner still
gets the alert and each job's Live Activity its `end`, exactly once."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.edge_retry import as_a_client_would
from tests.support.stacks import stack_of_its_own

pytestmark = pytest.mark.acceptance

JOBS = 6


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("cancel-delete-pushes")
    with stack_of_its_own(postgres_admin_url, work, "api", {}, apns_peer=True) as stack:
        yield stack


def peer_log(stack: Stack) -> list[dict[str, Any]]:
    """Every push the peer accepted, in order."""
    assert stack.log_dir is not None
    path = stack.log_dir / "apns-peer.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if '"apns_peer_push"' in x]


def tail(token: str) -> str:
    """How the peer names a device in its log."""
    return "…" + token[-8:]


class Owner:
    """A user with a device, one queued job and that job's Live Activity."""

    def __init__(self) -> None:
        self.user = User()
        self.headers = {**self.user.headers, "content-type": "application/json"}
        self.device_token = secrets.token_hex(32)
        self.activity_token = secrets.token_hex(40)
        self.job_id = ""

    async def prepare(self, http: httpx.AsyncClient, stack: Stack) -> None:
        # Registrations are upserts: sent again on a 503 with Retry-After, as a client
        # would (a clean run on a loaded machine met DATABASE_UNAVAILABLE here).
        device = await as_a_client_would(
            lambda: http.post(
                "/v1/devices",
                headers=self.headers,
                json={
                    "deviceToken": self.device_token,
                    "environment": "APNS_ENVIRONMENT_PRODUCTION",
                    "bundleId": "dev.atelier.app",
                    "locale": "en",
                },
            )
        )
        assert device.status_code == 200, device.text
        asset = await put_input(stack, self.user.user_id)
        submitted = await http.post("/v1/jobs", headers=self.headers, json=job_body(asset))
        assert submitted.status_code == 200, submitted.text
        self.job_id = submitted.json()["job"]["jobId"]
        device_id = device.json()["device"]["deviceId"]
        registered = await as_a_client_would(
            lambda: http.post(
                f"/v1/jobs/{self.job_id}/liveActivities",
                headers=self.headers,
                json={
                    "deviceId": device_id,
                    "pushToken": self.activity_token,
                    "activityId": "activity-1",
                },
            )
        )
        assert registered.status_code == 200, registered.text

    async def cancel_and_delete(self, http: httpx.AsyncClient) -> None:
        job = f"/v1/jobs/{self.job_id}"
        cancelled = await as_a_client_would(
            lambda: http.post(f"{job}:cancel", headers=self.headers, json={})
        )
        assert cancelled.status_code == 200, cancelled.text
        deleted = await as_a_client_would(lambda: http.delete(job, headers=self.user.headers))
        assert deleted.status_code == 200, deleted.text

    def alerts(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            p
            for p in received
            if p["device"] == tail(self.device_token) and p["payload"].get("jobId") == self.job_id
        ]

    def ends(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            p
            for p in received
            if p["device"] == tail(self.activity_token)
            and p["payload"]["aps"].get("event") == "end"
        ]


async def test_cancelling_and_deleting_queued_jobs_at_once_alerts_and_ends_each(
    running: Stack,
) -> None:
    owners = [Owner() for _ in range(JOBS)]
    url = f"http://127.0.0.1:{running.ports.envoy}"
    async with httpx.AsyncClient(base_url=url, timeout=15) as http:
        await asyncio.gather(*(owner.prepare(http, running) for owner in owners))
        await asyncio.gather(*(owner.cancel_and_delete(http) for owner in owners))

    def lacking() -> dict[str, list[str]]:
        """What each job still lacks at the peer."""
        received = peer_log(running)
        found = {}
        for owner in owners:
            lacks = [
                what
                for what, got in (("alert", owner.alerts(received)), ("end", owner.ends(received)))
                if not got
            ]
            if lacks:
                found[owner.job_id] = lacks
        return found

    deadline = time.monotonic() + 30
    while True:
        missing = lacking()
        if not missing:
            break
        assert time.monotonic() < deadline, f"{len(missing)} of {JOBS} jobs lack: {missing}"
        await asyncio.sleep(0.1)

    received = peer_log(running)
    for owner in owners:
        [alert], [end] = owner.alerts(received), owner.ends(received)
        assert alert["payload"]["status"] == "cancelled"
        assert end["payload"]["aps"]["content-state"]["status"] == "cancelled"

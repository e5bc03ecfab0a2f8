"""The APNs token RPCs through the real edge (Envoy's JSON transcoding): register, list
and delete a device, register and remove a Live Activity token, over HTTP+JSON; a token
that cannot be one is a 400 with field violations; another user sees nothing. notify runs
in the test's loop behind Envoy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from services.dev import edge
from services.dev.processes import free_port, http_ok, spawn, venv_binary, wait_until
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from tests.support.databases import migrated_database
from tests.support.notify import NotifyHarness, new_job_id, running_notify

TOKEN = "0a" * 32
START_TOKEN = "0b" * 40


def headers(user_id: str) -> dict[str, str]:
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 600)
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture(scope="module")
async def notify(notify_url: str) -> AsyncIterator[NotifyHarness]:
    async with running_notify(notify_url) as harness:
        yield harness


@pytest.fixture(scope="module")
def edge_url(notify: NotifyHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work: Path = tmp_path_factory.mktemp("devices-edge")
    listen, admin, nowhere = free_port(), free_port(), free_port()
    config = edge.render(
        listen_port=listen,
        admin_port=admin,
        upstream_ports={
            "creation": nowhere,
            "media": nowhere,
            "media_http": nowhere,
            "notify": notify.running.public_port,
        },
    )
    path = edge.write(work / "envoy.yaml", config)
    envoy = spawn(
        "envoy",
        [venv_binary("envoy"), "-c", str(path), "--disable-hot-restart", "--log-level", "warn"],
        {},
        work,
    )
    try:
        wait_until(envoy, http_ok(f"http://127.0.0.1:{admin}/ready"), 30)
        yield f"http://127.0.0.1:{listen}"
    finally:
        envoy.stop()


@pytest.fixture
async def http(edge_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=edge_url, timeout=10) as client:
        yield client


async def test_a_device_and_its_live_activity_over_json(http: httpx.AsyncClient) -> None:
    body = {
        "deviceToken": TOKEN,
        "environment": "APNS_ENVIRONMENT_SANDBOX",
        "bundleId": "dev.atelier.app",
        "pushToStartToken": START_TOKEN,
        "locale": "fr-FR",
    }
    first = await http.post("/v1/devices", json=body, headers=headers("frank"))
    assert first.status_code == 200, first.text
    device = first.json()["device"]
    assert device["hasPushToStartToken"] is True and device["locale"] == "fr-FR"
    again = await http.post("/v1/devices", json=body, headers=headers("frank"))
    assert again.json()["device"]["deviceId"] == device["deviceId"]

    listed = await http.get("/v1/devices", headers=headers("frank"))
    assert [d["deviceId"] for d in listed.json()["devices"]] == [device["deviceId"]]
    strangers = await http.get("/v1/devices", headers=headers("grace"))
    assert strangers.status_code == 200 and strangers.json().get("devices", []) == []

    job = new_job_id()
    activity = await http.post(
        f"/v1/jobs/{job}/liveActivities",
        json={"deviceId": device["deviceId"], "pushToken": "0c" * 50, "activityId": "a-1"},
        headers=headers("frank"),
    )
    assert activity.status_code == 200, activity.text
    assert activity.json()["activityId"] == "a-1"
    removed = await http.delete(f"/v1/jobs/{job}/liveActivities/a-1", headers=headers("frank"))
    assert removed.status_code == 200, removed.text
    gone = await http.delete(f"/v1/jobs/{job}/liveActivities/a-1", headers=headers("frank"))
    assert gone.status_code == 404
    assert gone.json()["details"][0]["reason"] == "LIVE_ACTIVITY_NOT_FOUND"
    # The pre-AIP path is no route at all (not a 404 from notify).
    for old in (
        http.post(f"/v1/jobs/{job}/live-activities", json={}, headers=headers("frank")),
        http.delete(f"/v1/jobs/{job}/live-activities/a-1", headers=headers("frank")),
    ):
        answer = await old
        assert answer.status_code == 404
        assert answer.json()["details"][0]["reason"] == "ROUTE_NOT_FOUND"

    not_graces = await http.delete(f"/v1/devices/{device['deviceId']}", headers=headers("grace"))
    assert not_graces.status_code == 404
    assert not_graces.json()["details"][0]["reason"] == "DEVICE_NOT_FOUND"
    deleted = await http.delete(f"/v1/devices/{device['deviceId']}", headers=headers("frank"))
    assert deleted.status_code == 200
    assert (await http.get("/v1/devices", headers=headers("frank"))).json().get("devices", []) == []


async def test_a_token_that_cannot_be_one_is_a_400_with_field_violations(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post(
        "/v1/devices",
        json={
            "deviceToken": "not-hex",
            "environment": "APNS_ENVIRONMENT_PRODUCTION",
            "bundleId": "dev.atelier.app",
        },
        headers=headers("frank"),
    )
    assert response.status_code == 400, response.text
    details = {d["@type"].rsplit("/", 1)[1]: d for d in response.json()["details"]}
    assert details["google.rpc.ErrorInfo"]["reason"] == "INVALID_DEVICE"
    violations = details["google.rpc.BadRequest"]["fieldViolations"]
    assert [v["field"] for v in violations] == ["device_token"]
    assert "hex" in violations[0]["description"]

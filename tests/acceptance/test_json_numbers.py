"""Numbers JSON clients can use (issue 27, point 8): points, prices, quotas, amounts and
sizes are 32-bit, so the edge's JSON carries them as numbers; a job's version stays a
64-bit string. A grant that would take a user's points past 2^31 - 1 is refused with
INVALID_ARGUMENT and a field violation on amount, nothing granted."""

from __future__ import annotations

import hashlib

import grpc
import httpx
import pytest

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc
from services.dev.stack import Stack
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.acceptance.test_jobs_edge import User, job_body, png, put_input
from tests.support.rpc import bad_request, bearer, error_info

INT32_MAX = 2**31 - 1


def is_number(value: object) -> bool:
    return type(value) is int


async def test_points_prices_quotas_and_sizes_are_json_numbers_and_version_a_string(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    catalog = (await http.get(f"{edge_url}/v1/catalog", headers=user.headers)).json()
    assert all(is_number(m["pricePoints"]) for m in catalog["models"]), catalog

    photo = png()
    upload = await http.post(
        f"{edge_url}/v1/uploads",
        headers=user.headers,
        json={
            "purpose": "ASSET_PURPOSE_AI_INPUT",
            "contentType": "image/png",
            "sizeBytes": len(photo),
            "sha256": hashlib.sha256(photo).hexdigest(),
        },
    )
    assert upload.status_code == 200, upload.text
    assert upload.json()["asset"]["sizeBytes"] == len(photo)

    asset = await put_input(stack, user.user_id)
    submitted = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["job"]
    try:
        assert job["pricePoints"] == 5 and job["numOutputs"] == 1
        assert job["version"] == "1"  # int64: a decimal string, compared as a number

        balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()
        numbers = (
            "availablePoints",
            "reservedPoints",
            "dailyJobQuota",
            "dailyJobsRemaining",
            "inFlightLimit",
            "inFlightRemaining",
        )
        assert all(is_number(balance[name]) for name in numbers), balance
        assert (balance["availablePoints"], balance["reservedPoints"]) == (95, 5)

        ledger = (await http.get(f"{edge_url}/v1/ledgerEntries", headers=user.headers)).json()
        assert sorted(e["amount"] for e in ledger["ledgerEntries"]) == [5, 100]
    finally:
        await http.post(f"{edge_url}/v1/jobs/{job['jobId']}:cancel", headers=user.headers, json={})


async def test_a_size_past_32_bits_is_refused_at_the_edge(
    edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    answer = await http.post(
        f"{edge_url}/v1/uploads",
        headers=user.headers,
        json={
            "purpose": "ASSET_PURPOSE_AI_INPUT",
            "contentType": "image/png",
            "sizeBytes": INT32_MAX + 1,
        },
    )
    assert answer.status_code == 400, answer.text


@pytest.fixture
async def admin(stack: Stack) -> object:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['creation']}") as ch:
        yield admin_service_pb2_grpc.AdminServiceStub(ch)


async def test_a_grant_past_32_bits_of_points_is_refused_over_grpc(
    admin: admin_service_pb2_grpc.AdminServiceStub, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()

    async def grant(amount: int, key: str) -> admin_service_pb2.GrantPointsResponse:
        return await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user.user_id, amount=amount, request_id=key
            ),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )

    # 100 welcome points, then grants up to exactly 2^31 - 1.
    await grant(1_000_000_000, "big-1")
    await grant(1_000_000_000, "big-2")
    top = await grant(INT32_MAX - 2_000_000_100, "big-3")
    assert top.available_points == INT32_MAX
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await grant(1, "one-more")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_ADMIN_REQUEST"
    details = bad_request(caught.value)
    assert details is not None
    assert [v.field for v in details.field_violations] == ["amount"]
    # Nothing was granted: the key is free, the balance where it was, a JSON number.
    balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()
    assert balance["availablePoints"] == INT32_MAX
    # A replay of the last grant that fitted still answers (it grants nothing more).
    assert (await grant(INT32_MAX - 2_000_000_100, "big-3")).available_points == INT32_MAX

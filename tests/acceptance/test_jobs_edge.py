"""Jobs through the whole stack: JSON through Envoy as a mobile client sends it, gRPC as
a developer does, and the operators' AdminService on creation's internal port. Input
photos are real assets stored by media."""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from PIL import Image
from sqlalchemy.ext.asyncio import create_async_engine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
)
from atelier.media.v1 import asset_pb2, media_internal_service_pb2, media_internal_service_pb2_grpc
from services.creation.store.fenced import FencedWrite, outputs_value
from services.dev.stack import Stack, StackPorts
from services.kit.auth import issue_token
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from tests.support.fenced import claim_this, fenced_write
from tests.support.rpc import bearer, error_info


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (200, 120, 40)).save(buffer, "PNG")
    return buffer.getvalue()


class User:
    def __init__(self) -> None:
        self.user_id = f"acc-{uuid.uuid4().hex[:10]}"
        self.token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", self.user_id, 3600)
        self.headers = {"authorization": f"Bearer {self.token}"}


async def put_input(
    stack: Stack, owner: str, purpose: int = asset_pb2.ASSET_PURPOSE_AI_INPUT, data: bytes = b""
) -> str:
    """Stores a real PNG (or ``data``) for ``owner`` through media's internal PutAsset."""
    data = data or png()

    async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner, purpose=purpose, content_type="image/png"
            )
        )
        for start in range(0, len(data), 1024):
            yield media_internal_service_pb2.PutAssetRequest(chunk=data[start : start + 1024])

    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['media']}") as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.PutAsset(parts(), metadata=bearer(DEV_SERVICE_TOKEN))
    return str(reply.asset.asset_id)


def job_body(asset_id: str, **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "modelId": "stub-fast",
        "styleId": "watercolor",
        "inputAssetId": asset_id,
        "prompt": "a fox in the snow",
        "width": 512,
        "height": 512,
        "parameters": {"seed": {"intValue": "3"}},
    }
    body.update(changes)
    return body


async def test_submit_replay_and_key_reuse_over_json(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    headers = {**user.headers, "idempotency-key": "order-1"}
    first = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset))
    assert first.status_code == 200, first.text
    job = first.json()["job"]
    assert (job["status"], job["version"], job["userId"]) == (
        "JOB_STATUS_QUEUED",
        "1",
        user.user_id,
    )
    assert job["pricePoints"] == 5

    replay = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset))
    assert replay.status_code == 200
    assert replay.json()["job"]["jobId"] == job["jobId"]

    reused = await http.post(
        f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset, prompt="a wolf")
    )
    assert reused.status_code == 409
    assert reused.json()["details"][0]["reason"] == "IDEMPOTENCY_KEY_REUSED"

    balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (95, 5)
    assert (balance["dailyJobQuota"], balance["dailyJobsRemaining"]) == (50, 49)
    assert (balance["inFlightLimit"], balance["inFlightRemaining"]) == (3, 2)
    assert balance["dailyQuotaResetTime"].endswith("T00:00:00Z")

    # The welcome grant and the reservation, a page each (the submit wrote both at once,
    # so their order is the ledger's ids').
    page = await http.get(f"{edge_url}/v1/ledgerEntries?pageSize=1", headers=user.headers)
    assert page.status_code == 200, page.text
    rest = await http.get(
        f"{edge_url}/v1/ledgerEntries",
        params={"pageSize": 1, "pageToken": page.json()["nextPageToken"]},
        headers=user.headers,
    )
    assert not rest.json().get("nextPageToken")
    [first_entry], [second_entry] = page.json()["ledgerEntries"], rest.json()["ledgerEntries"]
    assert sorted(
        (e["kind"], e["amount"], e.get("jobId", ""), e["reason"])
        for e in (first_entry, second_entry)
    ) == [
        ("LEDGER_ENTRY_KIND_GRANT", 100, "", "welcome"),
        ("LEDGER_ENTRY_KIND_RESERVE", 5, job["jobId"], "submitted"),
    ]


async def test_in_flight_limit_is_429_with_retry_after(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    statuses = [
        (
            await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
        ).status_code
        for _ in range(3)  # the stack's in-flight limit
    ]
    assert statuses == [200, 200, 200]
    refused = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in refused.json()["details"]}
    assert details["ErrorInfo"]["reason"] == "IN_FLIGHT_LIMIT_REACHED"
    assert details["RetryInfo"]["retryDelay"].endswith("s")


async def test_someone_elses_job_and_asset_are_404(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    owner, stranger = User(), User()
    asset = await put_input(stack, owner.user_id)
    job = (
        await http.post(f"{edge_url}/v1/jobs", headers=owner.headers, json=job_body(asset))
    ).json()["job"]

    for response in (
        await http.get(f"{edge_url}/v1/jobs/{job['jobId']}", headers=stranger.headers),
        await http.post(
            f"{edge_url}/v1/jobs/{job['jobId']}:cancel", headers=stranger.headers, json={}
        ),
        await http.get(f"{edge_url}/v1/jobs/{uuid.uuid4()}", headers=owner.headers),
    ):
        assert response.status_code == 404
        assert response.json()["details"][0]["reason"] == "JOB_NOT_FOUND"

    borrowed = await http.post(
        f"{edge_url}/v1/jobs", headers=stranger.headers, json=job_body(asset)
    )
    assert borrowed.status_code == 404
    assert borrowed.json()["details"][0]["reason"] == "INPUT_ASSET_NOT_FOUND"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"width": 100000}, "width"),
        ({"height": 7}, "height"),
        ({"modelId": ""}, "model_id"),
        ({"inputAssetId": "not-a-uuid"}, "input_asset_id"),
        # Not one of stub-fast's parameter specs; of another type; below its minimum;
        # holding no value.
        ({"parameters": {"steps": {"intValue": "30"}}}, "parameters.steps"),
        ({"parameters": {"seed": {"floatValue": 3.5}}}, "parameters.seed"),
        ({"parameters": {"seed": {"intValue": "-1"}}}, "parameters.seed"),
        ({"parameters": {"seed": {}}}, "parameters.seed"),
        ({"parameters": {"Seed!": {"intValue": "1"}}}, "parameters"),
        ({"numOutputs": 5}, "num_outputs"),
        ({"numOutputs": -1}, "num_outputs"),
    ],
)
async def test_invalid_request_is_400_naming_the_field(
    stack: Stack, edge_url: str, http: httpx.AsyncClient, changes: dict[str, object], field: str
) -> None:
    user = User()
    response = await http.post(
        f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(str(uuid.uuid4()), **changes)
    )
    assert response.status_code == 400
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in response.json()["details"]}
    assert details["ErrorInfo"]["reason"] == "INVALID_JOB_REQUEST"
    assert field in [v["field"] for v in details["BadRequest"]["fieldViolations"]]
    # Nothing was stored for the refused request.
    listed = (await http.get(f"{edge_url}/v1/jobs", headers=user.headers)).json()
    assert listed["jobs"] == []


async def test_an_output_asset_is_not_an_input(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    output = await put_input(stack, user.user_id, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
    response = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(output))
    assert response.status_code == 400
    assert response.json()["details"][0]["reason"] == "INPUT_ASSET_WRONG_PURPOSE"


async def test_list_cancel_and_events(stack: Stack, edge_url: str, http: httpx.AsyncClient) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    made = [
        (await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))).json()[
            "job"
        ]["jobId"]
        for _ in range(3)
    ]
    first_page = (await http.get(f"{edge_url}/v1/jobs?pageSize=2", headers=user.headers)).json()
    second_page = (
        await http.get(
            f"{edge_url}/v1/jobs?pageSize=2&pageToken={first_page['nextPageToken']}",
            headers=user.headers,
        )
    ).json()
    listed = [j["jobId"] for j in first_page["jobs"] + second_page["jobs"]]
    assert listed == list(reversed(made))
    assert second_page["nextPageToken"] == ""
    bad_size = await http.get(f"{edge_url}/v1/jobs?pageSize=-1", headers=user.headers)
    assert bad_size.status_code == 400
    assert bad_size.json()["details"][0]["reason"] == "INVALID_PAGE_SIZE"
    bad_token = await http.get(f"{edge_url}/v1/jobs?pageToken=garbage", headers=user.headers)
    assert bad_token.status_code == 400
    assert bad_token.json()["details"][0]["reason"] == "INVALID_PAGE_TOKEN"

    cancelled = await http.post(
        f"{edge_url}/v1/jobs/{made[0]}:cancel", headers=user.headers, json={}
    )
    assert cancelled.status_code == 200
    assert cancelled.json()["job"]["status"] == "JOB_STATUS_CANCELLED"
    again = await http.post(f"{edge_url}/v1/jobs/{made[0]}:cancel", headers=user.headers, json={})
    assert again.json()["job"]["version"] == cancelled.json()["job"]["version"]
    only_cancelled = (
        await http.get(f"{edge_url}/v1/jobs?statuses=JOB_STATUS_CANCELLED", headers=user.headers)
    ).json()
    assert [j["jobId"] for j in only_cancelled["jobs"]] == [made[0]]

    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{stack.ports.internal['creation']}"
    ) as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        events = await admin.ListJobEvents(
            admin_service_pb2.ListJobEventsRequest(job_id=made[0]),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )
        assert [e.actor_kind for e in events.events] == [1, 1]  # the user submitted and cancelled
        granted = await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user.user_id, amount=50, request_id="promo-1"
            ),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )
        replayed = await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user.user_id, amount=50, request_id="promo-1"
            ),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )
    assert granted.available_points == replayed.available_points == 100 - 10 + 50


async def test_submit_over_grpc_with_request_id(stack: Stack) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.public['creation']}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        request = creation_service_pb2.SubmitJobRequest(
            request_id="grpc-1",
            model_id="stub-detail",
            style_id="noir",
            input_asset_id=asset,
            width=768,
            height=512,
        )
        first = await stub.SubmitJob(request, metadata=bearer(user.token))
        second = await stub.SubmitJob(request, metadata=bearer(user.token))
        assert first.job.job_id == second.job.job_id
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(
                request, metadata=(*bearer(user.token), ("idempotency-key", "something-else"))
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fetched = await stub.GetJob(
            creation_service_pb2.GetJobRequest(job_id=first.job.job_id), metadata=bearer(user.token)
        )
        assert fetched.job.price_points == 15
        assert list(fetched.job.outputs) == []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetJob(
                creation_service_pb2.GetJobRequest(job_id="nope"), metadata=bearer(user.token)
            )
        assert error_info(caught.value).reason == "INVALID_JOB_ID"


async def test_a_succeeded_job_links_its_output(
    stack: Stack, edge_url: str, http: httpx.AsyncClient, database_url: str
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    job = (
        await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    ).json()["job"]
    picture = png()
    output = await put_input(stack, user.user_id, asset_pb2.ASSET_PURPOSE_AI_OUTPUT, picture)

    # Play the worker (the worker loop is not part of this stack yet): claim this very job
    # and complete it with the stored output.
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        now = datetime.now(UTC)
        claimed = await claim_this(
            engine, "acceptance-worker", job["jobId"], timedelta(seconds=30), now
        )
        assert await fenced_write(
            engine,
            FencedWrite.COMPLETE,
            job["jobId"],
            claimed.lease_epoch,
            now,
            outputs_value([output]),
        )
    finally:
        await engine.dispose()

    fetched = (await http.get(f"{edge_url}/v1/jobs/{job['jobId']}", headers=user.headers)).json()
    done = fetched["job"]
    assert (done["status"], done["progressPercent"], done["numOutputs"]) == (
        "JOB_STATUS_SUCCEEDED",
        100,
        1,
    )
    [linked] = done["outputs"]
    assert linked["assetId"] == output and linked["urlExpireTime"]
    download = await http.get(linked["url"])
    assert download.status_code == 200
    assert download.content == picture
    balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (95, 0)


# A stack of its own for the daily quota, small so that jobs left queued reach it, under
# an in-flight limit that never gets in the way (two days' quota: a midnight can pass).
DAILY_QUOTA = 3


@pytest.fixture
def quota_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(
        database_url=database_url,
        ports=StackPorts.free(),
        work_dir=tmp_path,
        log_dir=tmp_path / "logs",
        creation_role="api",
        extra_env={
            "ATELIER_DAILY_QUOTA": str(DAILY_QUOTA),
            "ATELIER_IN_FLIGHT_LIMIT": str(2 * DAILY_QUOTA + 2),
        },
    )
    running.start()
    yield running
    running.stop()


async def test_daily_quota_is_429_with_retry_after_until_midnight(
    quota_stack: Stack, http: httpx.AsyncClient
) -> None:
    """Holds at any time of day. A midnight may pass while the jobs are made, and jobs of
    the day before no longer count: so submit until refused, then check the refusal
    against the day it names (retry-after points at its end). A cancelled job gives its
    slot back (seed 001 §8): the first job is cancelled, so the day takes one more."""
    edge_url = f"http://127.0.0.1:{quota_stack.ports.envoy}"
    user = User()
    asset = await put_input(quota_stack, user.user_id)
    created: list[datetime] = []
    refused = None
    for n in range(2 * (DAILY_QUOTA + 1) + 1):
        before = datetime.now(UTC)
        made = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
        after = datetime.now(UTC)
        if made.status_code == 429:
            refused = made
            break
        assert made.status_code == 200, made.text
        job = made.json()["job"]
        if n == 0:
            cancelled = await http.post(
                f"{edge_url}/v1/jobs/{job['jobId']}:cancel", headers=user.headers, json={}
            )
            assert cancelled.json()["job"]["status"] == "JOB_STATUS_CANCELLED"
        else:
            created.append(datetime.fromisoformat(job["createTime"]))
    assert refused is not None, "the daily quota never refused"
    assert refused.json()["details"][0]["reason"] == "DAILY_QUOTA_EXCEEDED"
    retry_after = int(refused.headers["retry-after"])
    # The server refused at some instant in [before, after] and rounded the seconds to
    # its next midnight up: so after + retry_after lands on that midnight's day.
    midnight = (after + timedelta(seconds=retry_after)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    assert (midnight - after).total_seconds() <= retry_after
    assert retry_after <= (midnight - before).total_seconds() + 1
    assert midnight - before <= timedelta(days=1, seconds=1)
    # Exactly the quota of jobs not cancelled was made on the refusal's day.
    day_start = midnight - timedelta(days=1)
    assert sum(1 for when in created if when >= day_start) == DAILY_QUOTA
    balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()
    assert balance["dailyJobsRemaining"] == 0

"""Per-service credentials and acting for a user, on the whole stack through the real
Envoy edge: the dev stack's services call each other with their own credentials (a job
submitted through the edge asks media about its input with creation's); an app backend
with act_for_users submits, reads and cancels a user's job with its own credential and
the atelier-on-behalf-of header, seeing only that user's jobs; the job's events record
(user, backend); a user token with the header, or an identity without the permission,
is refused; an operator's credential reads the events and may not call media."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc, job_pb2
from atelier.media.v1 import media_internal_service_pb2, media_internal_service_pb2_grpc
from services.dev.credentials import DEV_BACKEND, DEV_OPERATOR
from services.dev.stack import Stack
from services.kit.delegation import ON_BEHALF_OF_HEADER
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.rpc import bearer, error_info


def acting_for(stack: Stack, user_id: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {stack.credentials.backend}",
        ON_BEHALF_OF_HEADER: user_id,
    }


async def events_of(stack: Stack, job_id: str) -> list[job_pb2.JobEvent]:
    address = f"127.0.0.1:{stack.ports.internal['creation']}"
    async with grpc.aio.insecure_channel(address) as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        reply = await admin.ListJobEvents(
            admin_service_pb2.ListJobEventsRequest(job_id=job_id),
            metadata=bearer(stack.credentials.operator),
            timeout=10,
        )
    return list(reply.events)


async def test_a_backend_acts_for_a_user_through_the_edge(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user, other = User(), User()
    asset = await put_input(stack, user.user_id)
    headers = acting_for(stack, user.user_id)
    submitted = await http.post(
        f"{edge_url}/v1/jobs", headers={**headers, "idempotency-key": "o-1"}, json=job_body(asset)
    )
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["job"]
    assert job["userId"] == user.user_id
    # The user sees the job the backend made for them, with their own token.
    mine = await http.get(f"{edge_url}/v1/jobs/{job['jobId']}", headers=user.headers)
    assert mine.status_code == 200, mine.text
    # Acting for another user, the backend sees only that user's jobs.
    theirs = await http.get(
        f"{edge_url}/v1/jobs/{job['jobId']}", headers=acting_for(stack, other.user_id)
    )
    assert theirs.status_code == 404
    listed = await http.get(f"{edge_url}/v1/jobs", headers=acting_for(stack, other.user_id))
    assert listed.status_code == 200 and listed.json().get("jobs", []) == []
    cancelled = await http.post(f"{edge_url}/v1/jobs/{job['jobId']}:cancel", headers=headers)
    assert cancelled.status_code == 200, cancelled.text

    events = await events_of(stack, job["jobId"])
    assert [(e.actor_kind, e.actor_id, e.via) for e in events] == [
        (job_pb2.ACTOR_KIND_USER, user.user_id, DEV_BACKEND),
        (job_pb2.ACTOR_KIND_USER, user.user_id, DEV_BACKEND),
    ]
    assert events[-1].to_status == job_pb2.JOB_STATUS_CANCELLED

    # The user's own cancel of another job names no backend.
    own = await http.post(
        f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset, prompt="own")
    )
    assert own.status_code == 200, own.text
    (event,) = await events_of(stack, own.json()["job"]["jobId"])
    assert (event.actor_id, event.via) == (user.user_id, "")


async def test_the_header_from_anyone_else_is_refused(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    target = f"acc-{uuid.uuid4().hex[:10]}"
    as_user = await http.get(
        f"{edge_url}/v1/jobs", headers={**user.headers, ON_BEHALF_OF_HEADER: target}
    )
    assert as_user.status_code == 403, as_user.text
    assert as_user.json()["details"][0]["reason"] == "ON_BEHALF_OF_NOT_PERMITTED"
    # The operator's identity may not act for users.
    as_operator = await http.get(
        f"{edge_url}/v1/jobs",
        headers={
            "authorization": f"Bearer {stack.credentials.operator}",
            ON_BEHALF_OF_HEADER: target,
        },
    )
    assert as_operator.status_code == 403
    assert as_operator.json()["details"][0]["reason"] == "ON_BEHALF_OF_NOT_PERMITTED"
    assert stack.credentials.operator not in as_operator.text
    bad = await http.get(f"{edge_url}/v1/jobs", headers=acting_for(stack, "no spaces allowed"))
    assert bad.status_code == 400
    assert bad.json()["details"][0]["reason"] == "ON_BEHALF_OF_INVALID"


async def test_the_operator_credential_may_not_call_media(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['media']}") as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetAssetInfo(
                media_internal_service_pb2.GetAssetInfoRequest(asset_id=str(uuid.uuid4())),
                metadata=bearer(stack.credentials.operator),
                timeout=10,
            )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    info = error_info(refused.value)
    assert info.reason == "RPC_NOT_PERMITTED"
    assert info.metadata["identity"] == DEV_OPERATOR


async def test_a_per_job_webhook_from_a_user_or_an_unpermitted_backend_is_403(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    """SubmitJob's webhook is honoured only for trusted service callers: through the edge
    a user's token (and the dev backend, which lacks per_job_webhooks) gets 403 with the
    JSON status, before any photo is looked at."""
    user = User()
    body = job_body(
        str(uuid.uuid4()),
        webhook={"url": "https://hooks.example.com/x", "eventTypes": ["job.succeeded"]},
    )
    for headers in (user.headers, acting_for(stack, user.user_id)):
        refused = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=body)
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json()["details"][0]["reason"] == "WEBHOOK_NOT_PERMITTED"

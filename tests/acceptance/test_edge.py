"""ListCatalog three ways (gRPC, HTTP/JSON through Envoy, the grpcurl binary), the auth
story at the edge, and the internal services out of the edge's reach."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2, media_internal_service_pb2_grpc
from atelier.notify.v1 import (
    notify_feed_service_pb2,
    notify_feed_service_pb2_grpc,
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
)
from services.dev.processes import venv_binary
from services.dev.stack import Stack
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from tests.support.rpc import bearer, error_info

SEEDED_MODELS = ["stub-fast", "stub-detail", "stub-portrait", "stub-text"]


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_binary("grpcurl"), *args], capture_output=True, text=True, timeout=30, check=False
    )


async def test_list_catalog_over_grpc(stack: Stack, token: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.public['creation']}") as channel:
        reply = await creation_service_pb2_grpc.CreationServiceStub(channel).ListCatalog(
            creation_service_pb2.ListCatalogRequest(), metadata=bearer(token)
        )
    assert [m.model_id for m in reply.models] == SEEDED_MODELS
    assert [s.style_id for s in reply.styles] == ["natural", "watercolor", "anime", "noir"]


def test_list_catalog_as_json_through_envoy(edge_url: str, token: str) -> None:
    response = httpx.get(f"{edge_url}/v1/catalog", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert [m["modelId"] for m in body["models"]] == SEEDED_MODELS
    assert body["models"][0]["mediaKind"] == "MEDIA_KIND_IMAGE"
    assert body["models"][0]["pricePoints"] == 5
    # The model says what SubmitJob enforces; an int64 bound stays exact (a JSON string).
    assert body["models"][0]["sizeRange"] == {
        "minWidth": 64,
        "maxWidth": 2048,
        "minHeight": 64,
        "maxHeight": 2048,
        "multipleOf": 8,
    }
    [seed] = body["models"][0]["parameterSpecs"]
    assert (seed["name"], seed["type"], seed["min"], seed["max"]) == (
        "seed",
        "PARAMETER_TYPE_INT",
        {"intValue": "0"},
        {"intValue": "9223372036854775807"},
    )


def test_list_catalog_with_grpcurl_through_reflection(stack: Stack, token: str) -> None:
    result = grpcurl(
        "-plaintext",
        "-H",
        f"authorization: Bearer {token}",
        f"127.0.0.1:{stack.ports.public['creation']}",
        "atelier.creation.v1.CreationService/ListCatalog",
    )
    assert result.returncode == 0, result.stderr
    # grpcurl prints proto field names when it learns the schema through reflection.
    assert [m["model_id"] for m in json.loads(result.stdout)["models"]] == SEEDED_MODELS


def test_grpcurl_lists_only_public_services_on_the_public_port(stack: Stack) -> None:
    for service, public, internal in [
        ("creation", "atelier.creation.v1.CreationService", "atelier.creation.v1.AdminService"),
        ("media", "atelier.media.v1.MediaService", "atelier.media.v1.MediaInternalService"),
        ("notify", "atelier.notify.v1.NotifyService", "atelier.notify.v1.NotifyIngestService"),
        ("notify", "atelier.notify.v1.NotifyService", "atelier.notify.v1.NotifyFeedService"),
    ]:
        result = grpcurl("-plaintext", f"127.0.0.1:{stack.ports.public[service]}", "list")
        assert result.returncode == 0, result.stderr
        listed = result.stdout.split()
        assert public in listed and "grpc.health.v1.Health" in listed
        assert internal not in listed


def test_grpcurl_through_envoy_with_the_descriptor_set(
    edge_url: str, token: str, descriptor: Path
) -> None:
    result = grpcurl(
        "-plaintext",
        "-protoset",
        str(descriptor),
        "-H",
        f"authorization: Bearer {token}",
        edge_url.removeprefix("http://"),
        "atelier.creation.v1.CreationService/ListCatalog",
    )
    assert result.returncode == 0, result.stderr
    assert "stub-fast" in result.stdout


async def test_no_token_is_unauthenticated_over_grpc(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.public['creation']}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await creation_service_pb2_grpc.CreationServiceStub(channel).ListCatalog(
                creation_service_pb2.ListCatalogRequest()
            )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(caught.value).reason == "TOKEN_MISSING"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "TOKEN_MISSING"),
        ({"authorization": "Bearer not.a.jwt"}, "TOKEN_MALFORMED"),
        ({"authorization": "Token abc"}, "TOKEN_MALFORMED"),
        (
            {
                "authorization": "Bearer "
                + issue_token(
                    DEV_JWT_SECRET, "atelier", "atelier-app", "u", 60, now=time.time() - 7200
                )
            },
            "TOKEN_EXPIRED",
        ),
        (
            {"authorization": "Bearer " + issue_token("z" * 40, "atelier", "atelier-app", "u", 60)},
            "TOKEN_INVALID",
        ),
    ],
)
def test_http_401_says_which_token_problem(
    edge_url: str, headers: dict[str, str], reason: str
) -> None:
    response = httpx.get(f"{edge_url}/v1/catalog", headers=headers)
    assert response.status_code == 401
    body = response.json()
    assert body["code"] == 16
    assert body["details"][0]["reason"] == reason
    assert body["details"][0]["domain"] == "atelier.dev"


async def _first_message(call: Any) -> Any:
    async for message in call:
        return message
    return None


async def test_internal_services_are_unreachable_through_envoy(stack: Stack) -> None:
    service_token = bearer(DEV_SERVICE_TOKEN)
    calls = [
        lambda ch: admin_service_pb2_grpc.AdminServiceStub(ch).ListAttentionJobs(
            admin_service_pb2.ListAttentionJobsRequest(), metadata=service_token
        ),
        lambda ch: worker_service_pb2_grpc.WorkerServiceStub(ch).ClaimJob(
            worker_service_pb2.ClaimJobRequest(), metadata=service_token
        ),
        lambda ch: media_internal_service_pb2_grpc.MediaInternalServiceStub(ch).GetAssetUrl(
            media_internal_service_pb2.GetAssetUrlRequest(asset_id="a"), metadata=service_token
        ),
        lambda ch: notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(ch).Deliver(
            notify_ingest_service_pb2.DeliverRequest(), metadata=service_token
        ),
        # The job feed (a stream): the shared service credential may call it on notify's
        # internal listener, and the edge has no route to it.
        lambda ch: _first_message(
            notify_feed_service_pb2_grpc.NotifyFeedServiceStub(ch).WatchAllJobs(
                notify_feed_service_pb2.WatchAllJobsRequest(), metadata=service_token
            )
        ),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.envoy}") as channel:
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(channel)
            # Envoy's own 404, not an answer from any of our servers.
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "no such route" in (caught.value.details() or "")
            assert not any(
                k == "grpc-status-details-bin" for k, _ in caught.value.trailing_metadata() or ()
            )


def test_internal_paths_are_404_over_http(edge_url: str) -> None:
    for path in [
        "/atelier.creation.v1.AdminService/ListAttentionJobs",
        "/atelier.creation.v1.WorkerService/ClaimJob",
        "/atelier.media.v1.MediaInternalService/DeleteAsset",
        "/atelier.notify.v1.NotifyIngestService/Deliver",
        "/atelier.notify.v1.NotifyFeedService/WatchAllJobs",
    ]:
        response = httpx.post(
            f"{edge_url}{path}",
            headers={
                "authorization": f"Bearer {DEV_SERVICE_TOKEN}",
                "content-type": "application/json",
            },
            content="{}",
        )
        assert response.status_code == 404, path


def test_unknown_route_and_query_parameter_are_rejected_by_the_edge(
    edge_url: str, token: str
) -> None:
    auth = {"authorization": f"Bearer {token}"}
    assert httpx.get(f"{edge_url}/v1/nothing-here", headers=auth).status_code == 404
    assert httpx.get(f"{edge_url}/v1/catalog?bogus=1", headers=auth).status_code == 400


def test_metrics_count_rpcs_by_method_and_code(stack: Stack, edge_url: str, token: str) -> None:
    httpx.get(f"{edge_url}/v1/catalog", headers={"authorization": f"Bearer {token}"})
    text = httpx.get(f"http://127.0.0.1:{stack.ports.metrics['creation']}/metrics").text
    assert (
        'atelier_rpc_total{code="OK",method="/atelier.creation.v1.CreationService/ListCatalog",service="creation"}'
        in text
    )
    assert "atelier_rpc_duration_seconds_bucket" in text


async def test_no_credential_reaches_any_log(stack: Stack, edge_url: str, token: str) -> None:
    """After calls with good, bad and internal credentials, no service or edge log holds
    any of them (nor the signing secret)."""
    bad = issue_token("q" * 40, "atelier", "atelier-app", "u", 60)
    async with httpx.AsyncClient() as http:
        for credential in (token, bad, DEV_SERVICE_TOKEN):
            await http.get(
                f"{edge_url}/v1/catalog", headers={"authorization": f"Bearer {credential}"}
            )
            await http.get(
                f"{edge_url}/v1/jobs/{'0' * 8}", headers={"authorization": f"Bearer {credential}"}
            )
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{stack.ports.internal['creation']}"
    ) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await admin_service_pb2_grpc.AdminServiceStub(channel).ListJobEvents(
                admin_service_pb2.ListJobEventsRequest(job_id="x"), metadata=bearer(bad)
            )
    assert stack.log_dir is not None
    logs = {path.name: path.read_text(errors="replace") for path in stack.log_dir.glob("*.log")}
    assert {"creation.log", "media.log", "notify.log", "envoy.log"} <= set(logs)
    assert any("rpc_finished" in text for text in logs.values())
    for secret in (token, bad, DEV_SERVICE_TOKEN, DEV_JWT_SECRET):
        leaked = [name for name, text in logs.items() if secret in text]
        assert leaked == [], f"a credential appears in {leaked}"

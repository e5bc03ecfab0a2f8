"""Open generation parameters through the whole stack: a model that gains settings in the
catalog (a row written while the stack runs, no contract change) takes them at once,
through Envoy's JSON and over gRPC, each typed (bool, int, float, string, enum) and
echoed exactly by the job; an unknown, ill-typed, out-of-range or unlisted value is
INVALID_ARGUMENT naming `parameters.<name>`, and nothing is stored for it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from atelier.creation.v1.parameters_pb2 import ParameterValue
from atelier.media.v1 import asset_pb2
from services.creation.parameters import from_stored
from services.creation.store.fenced import FencedWrite, outputs_value
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.fenced import claim_this, fenced_write
from tests.support.rpc import bad_request, error_info

SPECS = [
    {"name": "seed", "type": "int", "min": 0, "max": 2**63 - 1},
    {"name": "sampler", "type": "enum", "choices": ["euler", "ddim"], "default": "euler"},
    {"name": "hdr", "type": "bool", "default": False},
    {"name": "caption", "type": "string"},
    {"name": "detail", "type": "float", "min": 0.0, "max": 1.0, "default": 0.5},
]
SENT = {
    "seed": {"intValue": "9223372036854775807"},
    "sampler": {"stringValue": "ddim"},
    "hdr": {"boolValue": True},
    "caption": {"stringValue": "a note"},
    "detail": {"floatValue": 0.25},
}


@pytest.fixture
async def tuned_model(stack: Stack) -> AsyncIterator[str]:
    """A copy of stub-fast with five settings, added to the running stack's catalog (and
    disabled afterwards: the catalog tests count the enabled models)."""
    model_id = f"stub-tuned-{uuid.uuid4().hex[:8]}"
    engine = create_async_engine(asyncpg_url(stack.database_url))
    copy = text(
        "INSERT INTO creation.models (model_id, display_name, description, media_kind,"
        " enabled, sort_order, price_points, provider_code, provider_model, min_width,"
        " max_width, min_height, max_height, size_multiple, parameter_specs, input_image)"
        " SELECT :model_id, 'Tuned', description, media_kind, true, 99, price_points,"
        " provider_code, provider_model, min_width, max_width, min_height, max_height,"
        " size_multiple, CAST(:specs AS jsonb), input_image"
        " FROM creation.models WHERE model_id = 'stub-fast'"
    )
    async with engine.begin() as connection:
        await connection.execute(copy, {"model_id": model_id, "specs": json.dumps(SPECS)})
    yield model_id
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE creation.models SET enabled = false WHERE model_id = :m"),
            {"m": model_id},
        )
    await engine.dispose()


@pytest.fixture
async def engine(stack: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(stack.database_url))
    yield engine
    await engine.dispose()


async def jobs_of(engine: AsyncEngine, user: User) -> int:
    async with engine.connect() as connection:
        found = await connection.execute(
            text("SELECT count(*) FROM creation.jobs WHERE user_id = :u"), {"u": user.user_id}
        )
        return int(found.scalar_one())


async def test_a_setting_added_to_the_catalog_is_taken_typed_and_echoed_through_the_edge(
    stack: Stack, edge_url: str, http: httpx.AsyncClient, engine: AsyncEngine, tuned_model: str
) -> None:
    user = User()
    catalog = (await http.get(f"{edge_url}/v1/catalog", headers=user.headers)).json()
    [model] = [m for m in catalog["models"] if m["modelId"] == tuned_model]
    specs = {spec["name"]: spec for spec in model["parameterSpecs"]}
    assert specs["sampler"]["type"] == "PARAMETER_TYPE_ENUM"
    assert specs["sampler"]["choices"] == ["euler", "ddim"]
    assert specs["sampler"]["defaultValue"] == {"stringValue": "euler"}
    assert specs["hdr"]["type"] == "PARAMETER_TYPE_BOOL"
    assert specs["detail"]["max"] == {"floatValue": 1.0}

    asset = await put_input(stack, user.user_id)
    body = job_body(asset, modelId=tuned_model, parameters=SENT)
    submitted = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=body)
    assert submitted.status_code == 200, submitted.text
    job: dict[str, Any] = submitted.json()["job"]
    assert job["parameters"] == SENT
    # The worker (played here: this stack's API runs none) gets each value in its type.
    now = datetime.now(UTC)
    claimed = await claim_this(engine, "tuned-worker", job["jobId"], timedelta(seconds=30), now)
    assert from_stored(claimed.parameters) == {
        "seed": 2**63 - 1,
        "sampler": "ddim",
        "hdr": True,
        "caption": "a note",
        "detail": 0.25,
    }
    output = await put_input(stack, user.user_id, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
    assert await fenced_write(
        engine,
        FencedWrite.COMPLETE,
        job["jobId"],
        claimed.lease_epoch,
        now,
        outputs_value([output]),
    )
    read = await http.get(f"{edge_url}/v1/jobs/{job['jobId']}", headers=user.headers)
    done = read.json()["job"]
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert done["parameters"] == SENT
    # The edge takes an int64 only as the document writes it, a string of digits (a JSON
    # number past 2^53 would already have lost digits in the client): 400 naming it.
    replay = {**body, "requestId": "tuned-1"}
    replay["parameters"] = {**SENT, "seed": {"intValue": 7}}
    again = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=replay)
    assert again.status_code == 400, again.text
    violations = again.json()["details"][1]["fieldViolations"]
    assert [v["field"] for v in violations] == ["parameters.seed.intValue"]


@pytest.mark.parametrize(
    ("model", "parameters", "field", "says"),
    [
        ("tuned", {"sampler": {"stringValue": "karras"}}, "parameters.sampler", "one of"),
        ("tuned", {"hdr": {"stringValue": "yes"}}, "parameters.hdr", "bool_value"),
        ("tuned", {"seed": {"floatValue": 1.5}}, "parameters.seed", "int_value"),
        ("tuned", {"detail": {"floatValue": 2.0}}, "parameters.detail", "at most"),
        ("tuned", {"caption": {"stringValue": "x" * 1001}}, "parameters.caption", "1000"),
        ("tuned", {"eta": {"floatValue": 0.1}}, "parameters.eta", "not a parameter"),
        ("tuned", {"hdr": {}}, "parameters.hdr", "must hold a value"),
        # The model it was not added to does not take it.
        ("stub-fast", {"sampler": {"stringValue": "ddim"}}, "parameters.sampler", "stub-fast"),
    ],
)
async def test_a_bad_parameter_is_400_naming_it_and_stores_nothing(
    stack: Stack,
    edge_url: str,
    http: httpx.AsyncClient,
    engine: AsyncEngine,
    tuned_model: str,
    model: str,
    parameters: dict[str, object],
    field: str,
    says: str,
) -> None:
    user = User()
    body = job_body(
        str(uuid.uuid4()),
        modelId=tuned_model if model == "tuned" else model,
        parameters=parameters,
    )
    response = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=body)
    assert response.status_code == 400, response.text
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in response.json()["details"]}
    assert details["ErrorInfo"]["reason"] == "INVALID_JOB_REQUEST"
    violations = {v["field"]: v["description"] for v in details["BadRequest"]["fieldViolations"]}
    assert says in violations[field], violations
    assert await jobs_of(engine, user) == 0


async def test_parameters_over_grpc_keep_their_types(
    stack: Stack, engine: AsyncEngine, tuned_model: str
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    values = {
        "seed": ParameterValue(int_value=2**63 - 1),
        "sampler": ParameterValue(string_value="euler"),
        "hdr": ParameterValue(bool_value=False),
        "detail": ParameterValue(float_value=0.0),
    }
    request = creation_service_pb2.SubmitJobRequest(
        model_id=tuned_model,
        style_id="watercolor",
        input_asset_id=asset,
        width=512,
        height=512,
        parameters=values,
    )
    metadata = (("authorization", user.headers["authorization"]),)
    target = f"127.0.0.1:{stack.ports.public['creation']}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await stub.SubmitJob(request, metadata=metadata)).job
        # False and 0.0 are values given, not absent ones.
        assert dict(job.parameters) == values
        read = await stub.GetJob(
            creation_service_pb2.GetJobRequest(job_id=job.job_id), metadata=metadata
        )
        assert dict(read.job.parameters) == values

        wrong = creation_service_pb2.SubmitJobRequest()
        wrong.CopyFrom(request)
        wrong.parameters["hdr"].CopyFrom(ParameterValue(int_value=1))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(wrong, metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_JOB_REQUEST"
    violations = bad_request(caught.value)
    assert violations is not None
    assert [v.field for v in violations.field_violations] == ["parameters.hdr"]
    assert await jobs_of(engine, user) == 1

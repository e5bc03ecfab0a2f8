"""One job shape everywhere (issue 27, point 1): what notify's streams send of a job is
the message creation's GetJob answers for that version, field for field (apart from the
signed download URLs, signed afresh by whoever answers), through the edge as JSON and
over gRPC, on a whole stack that runs the job to its end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc, job_pb2
from atelier.notify.v1 import notify_service_pb2, notify_service_pb2_grpc
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.rpc import bearer
from tests.support.stacks import stack_of_its_own

# Signed when sent: a stream's URL and a read's differ in their signature and expiry.
SIGNED = ("url", "urlExpireTime", "thumbnailUrl", "thumbnailUrlExpireTime")
# What the streams' former JobState lacked, and a client drew a job with.
DRAWN = ("modelId", "styleId", "inputAssetId", "prompt", "createTime", "numOutputs")


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("one-shape")
    engine_env = {"ATELIER_STUB_DURATION": "1", "ATELIER_WORKER_PROVIDER_POLL": "0.2"}
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


def unsigned(job: dict[str, Any]) -> dict[str, Any]:
    """The job's JSON without its outputs' signed URLs."""
    outputs = [{k: v for k, v in o.items() if k not in SIGNED} for o in job.get("outputs", [])]
    return {**job, "outputs": outputs} if outputs else dict(job)


def unsigned_message(job: job_pb2.Job) -> job_pb2.Job:
    copy = job_pb2.Job()
    copy.CopyFrom(job)
    for output in copy.outputs:
        for field in ("url", "url_expire_time", "thumbnail_url", "thumbnail_url_expire_time"):
            output.ClearField(field)
    return copy


async def test_watch_job_through_the_edge_ends_with_the_job_get_job_returns(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    body = job_body(asset, negativePrompt="blur", numOutputs=2)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=body)
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]
    curl = await asyncio.create_subprocess_exec(
        "curl",
        "-sN",
        "-H",
        f"authorization: {user.headers['authorization']}",
        f"{url}/v1/jobs/{job_id}:watch",
        stdout=asyncio.subprocess.PIPE,
    )
    assert curl.stdout is not None
    out = await asyncio.wait_for(curl.stdout.read(), 60)
    await curl.wait()
    jobs = [json.loads(line)["job"] for line in out.decode().splitlines() if '"job"' in line]
    last = jobs[-1]
    assert last["status"] == "JOB_STATUS_SUCCEEDED" and last["done"] is True
    # Every version the stream sent is a whole job, drawn without a second call.
    for sent in jobs:
        assert all(sent.get(field) for field in DRAWN), sent
        assert sent["parameters"] == {"seed": {"intValue": "3"}}
    read = await http.get(f"{url}/v1/jobs/{job_id}", headers=user.headers)
    assert read.status_code == 200, read.text
    got = read.json()["job"]
    assert got["version"] == last["version"]
    assert unsigned(last) == unsigned(got)
    assert len(got["outputs"]) == 2 and all(o["url"] for o in last["outputs"])
    # The listing carries the same job.
    listed = await http.get(f"{url}/v1/jobs", headers=user.headers)
    assert [unsigned(j) for j in listed.json()["jobs"]] == [unsigned(got)]


async def test_watch_jobs_and_watch_job_over_grpc_carry_the_job_get_job_returns(
    running: Stack,
) -> None:
    user = User()
    metadata = bearer(user.token)
    asset = await put_input(running, user.user_id)
    creation_address = f"127.0.0.1:{running.ports.public['creation']}"
    notify_address = f"127.0.0.1:{running.ports.public['notify']}"
    async with (
        grpc.aio.insecure_channel(creation_address) as creation_channel,
        grpc.aio.insecure_channel(notify_address) as notify_channel,
    ):
        creation = creation_service_pb2_grpc.CreationServiceStub(creation_channel)
        notify = notify_service_pb2_grpc.NotifyServiceStub(notify_channel)
        stream = notify.WatchJobs(notify_service_pb2.WatchJobsRequest(), metadata=metadata)
        first = await asyncio.wait_for(stream.read(), 10)
        assert first.WhichOneof("event") == "snapshot_end"  # a new user: nothing yet
        request = creation_service_pb2.SubmitJobRequest()
        json_format.ParseDict(job_body(asset, prompt="a heron"), request)
        submitted = await creation.SubmitJob(request, metadata=metadata)
        job_id = submitted.job.job_id
        # SubmitJob's answer is the first version, as the streams will tell it.
        seen: dict[int, job_pb2.Job] = {}
        async with asyncio.timeout(60):
            while True:
                message = await stream.read()
                assert message is not grpc.aio.EOF
                if message.WhichOneof("event") != "job":
                    continue
                assert message.job.job_id == job_id
                seen[message.job.version] = message.job
                if message.job.done:
                    break
        stream.cancel()
        last = seen[max(seen)]
        got = (
            await creation.GetJob(
                creation_service_pb2.GetJobRequest(job_id=job_id), metadata=metadata
            )
        ).job
        assert got.version == last.version and got.status == job_pb2.JOB_STATUS_SUCCEEDED
        assert unsigned_message(last) == unsigned_message(got)
        if 1 in seen:
            assert unsigned_message(seen[1]) == unsigned_message(submitted.job)
        assert all(j.model_id == "stub-fast" and j.prompt == "a heron" for j in seen.values())
        # WatchJob of the finished job sends that same job, then ends.
        watched = [
            m.job
            async for m in notify.WatchJob(
                notify_service_pb2.WatchJobRequest(job_id=job_id), metadata=metadata
            )
            if m.WhichOneof("event") == "job"
        ]
        assert [unsigned_message(j) for j in watched] == [unsigned_message(got)]
        assert watched[0].outputs[0].url

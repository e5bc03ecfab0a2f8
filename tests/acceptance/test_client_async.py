"""The asyncio client against the whole stack (creation with its job engine and the stub
provider, media, notify, the edge), straight to each service's public port as an internal
service calls them: a photo uploaded, a job submitted and waited for; a wait that outlives
a notify process killed and started again; a bad model refused with its reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from atelier.creation.v1 import job_pb2
from atelier_client import AsyncClient, InvalidArgument, JobState
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, png
from tests.support.stacks import stack_of_its_own


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("client")
    env = {
        # Long enough for notify to be killed and back while the job runs.
        "ATELIER_STUB_DURATION": "2",
        "ATELIER_HEARTBEAT": "0.5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        # creation's relay redelivers to the restarted notify within a second.
        "ATELIER_RELAY_BACKOFF_MAX": "1",
    }
    with stack_of_its_own(postgres_admin_url, work, "all", env) as stack:
        yield stack


@pytest.fixture
async def atelier(running: Stack) -> AsyncIterator[AsyncClient]:
    public = running.ports.public
    async with AsyncClient.connect(
        f"127.0.0.1:{public['creation']}",
        media=f"127.0.0.1:{public['media']}",
        notify=f"127.0.0.1:{public['notify']}",
        token=User().token,
    ) as client:
        yield client


async def submitted(atelier: AsyncClient) -> job_pb2.Job:
    asset = await atelier.upload(png(), "image/png")
    return await atelier.submit(
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id=asset.asset_id,
        prompt="a fox",
        width=512,
        height=512,
    )


async def test_submit_then_wait_returns_the_succeeded_state(atelier: AsyncClient) -> None:
    job = await submitted(atelier)
    assert job.status == job_pb2.JOB_STATUS_QUEUED

    final = await atelier.wait(job.job_id, timeout=60)

    assert (final.job_id, final.status, final.done) == (
        job.job_id,
        job_pb2.JOB_STATUS_SUCCEEDED,
        True,
    )
    assert final.outputs and final.outputs[0].url
    assert (await atelier.get_job(job.job_id)).version == final.version


async def test_wait_outlives_notify_killed_and_started_again(
    running: Stack, atelier: AsyncClient
) -> None:
    job = await submitted(atelier)
    running_seen = asyncio.Event()

    def seen(state: JobState) -> None:
        if state.status == job_pb2.JOB_STATUS_RUNNING:
            running_seen.set()

    waiting = asyncio.create_task(atelier.wait(job.job_id, timeout=60, on_state=seen))
    # The wait's own stream is open and delivering when notify dies.
    await asyncio.wait_for(running_seen.wait(), 30)
    assert not waiting.done()

    notify = running.child("notify")
    running.children.remove(notify)
    notify.process.kill()  # no drain: the open stream is reset
    await asyncio.to_thread(notify.process.wait)
    await asyncio.to_thread(running.start_service, "notify")

    final = await asyncio.wait_for(waiting, 60)
    assert (final.job_id, final.status) == (job.job_id, job_pb2.JOB_STATUS_SUCCEEDED)
    assert running.child("notify").process.pid != notify.process.pid


async def test_a_bad_model_is_a_typed_error_with_its_reason(atelier: AsyncClient) -> None:
    asset = await atelier.upload(png(), "image/png")
    with pytest.raises(InvalidArgument) as raised:
        await atelier.submit(
            model_id="no-such-model",
            style_id="watercolor",
            input_asset_id=asset.asset_id,
            width=512,
            height=512,
        )
    assert raised.value.reason == "MODEL_NOT_AVAILABLE"
    assert raised.value.domain == "atelier.dev"
    assert [v.field for v in raised.value.field_violations] == ["model_id"]

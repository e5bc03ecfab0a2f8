"""The asyncio client against the whole stack (creation with its job engine and the stub
provider, media, notify, the edge), straight to each service's public port as an internal
service calls them: a photo uploaded, a job submitted and waited for; a wait that outlives
a notify process killed and started again; a bad model refused with its reason; a repeated
cancel, DeleteJob, the ledger, WatchJobs resumed from a cursor, devices and Live
Activities."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from atelier.creation.v1 import job_pb2, ledger_pb2
from atelier.notify.v1 import notify_service_pb2
from atelier_client import AsyncClient, FailedPrecondition, InvalidArgument, Job, NotFound
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

    def seen(state: Job) -> None:
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


async def test_submit_then_wait_job_returns_the_succeeded_job_in_one_call(
    atelier: AsyncClient,
) -> None:
    job = await submitted(atelier)
    done = await atelier.wait_job(job.job_id, 30)
    assert done.status == job_pb2.JOB_STATUS_SUCCEEDED
    assert done.outputs and done.outputs[0].url
    # A finished job answers at once.
    assert (await atelier.wait_job(job.job_id, 60)).version == done.version


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


async def test_a_repeated_cancel_answers_the_job_as_it_is(atelier: AsyncClient) -> None:
    job = await submitted(atelier)
    first = await atelier.cancel_job(job.job_id)
    again = await atelier.cancel_job(job.job_id)  # what a retry after a lost answer sends
    assert again.job_id == job.job_id
    assert again.version >= first.version
    assert again.status == job_pb2.JOB_STATUS_CANCELLED or again.cancel_requested
    final = await atelier.wait(job.job_id, timeout=60)
    assert final.status == job_pb2.JOB_STATUS_CANCELLED
    assert (await atelier.cancel_job(job.job_id)).version == final.version  # still accepted


async def test_delete_job_removes_it_and_is_repeatable(atelier: AsyncClient) -> None:
    job = await submitted(atelier)
    await atelier.wait(job.job_id, timeout=60)
    await atelier.delete_job(job.job_id)
    with pytest.raises(NotFound) as raised:
        await atelier.get_job(job.job_id)
    assert raised.value.reason == "JOB_NOT_FOUND"
    await atelier.delete_job(job.job_id)  # deleting it again succeeds
    assert job.job_id not in [j.job_id for j in (await atelier.list_jobs()).jobs]


async def test_delete_job_refuses_an_unfinished_job(atelier: AsyncClient) -> None:
    job = await submitted(atelier)
    with pytest.raises(FailedPrecondition) as raised:
        await atelier.delete_job(job.job_id, keep_assets=True)
    assert raised.value.reason == "JOB_NOT_FINISHED"
    await atelier.cancel_job(job.job_id)


async def test_the_ledger_shows_the_grant_and_the_job_s_points(atelier: AsyncClient) -> None:
    job = await submitted(atelier)
    final = await atelier.wait(job.job_id, timeout=60)
    assert final.status == job_pb2.JOB_STATUS_SUCCEEDED
    entries = (await atelier.list_ledger_entries(page_size=100)).ledger_entries
    kinds = {(e.kind, e.job_id) for e in entries}
    assert (ledger_pb2.LEDGER_ENTRY_KIND_GRANT, "") in kinds
    assert (ledger_pb2.LEDGER_ENTRY_KIND_RESERVE, job.job_id) in kinds
    assert (ledger_pb2.LEDGER_ENTRY_KIND_CAPTURE, job.job_id) in kinds
    first = await atelier.list_ledger_entries(page_size=1)
    assert len(first.ledger_entries) == 1 and first.next_page_token
    rest = await atelier.list_ledger_entries(page_size=100, page_token=first.next_page_token)
    assert [e.entry_id for e in [*first.ledger_entries, *rest.ledger_entries]] == [
        e.entry_id for e in entries
    ]
    balance = await atelier.get_balance()
    granted = sum(e.amount for e in entries if e.kind == ledger_pb2.LEDGER_ENTRY_KIND_GRANT)
    captured = sum(e.amount for e in entries if e.kind == ledger_pb2.LEDGER_ENTRY_KIND_CAPTURE)
    assert (balance.available_points, balance.reserved_points) == (granted - captured, 0)


async def next_news(
    watching: AsyncIterator[notify_service_pb2.WatchJobsResponse],
    wanted: Callable[[notify_service_pb2.WatchJobsResponse], bool],
) -> notify_service_pb2.WatchJobsResponse:
    async def first() -> notify_service_pb2.WatchJobsResponse:
        async for message in watching:
            if wanted(message):
                return message
        raise AssertionError("the watch ended")

    return await asyncio.wait_for(first(), 30)


def is_snapshot_end(message: notify_service_pb2.WatchJobsResponse) -> bool:
    return message.WhichOneof("event") == "snapshot_end"


async def test_watch_jobs_resumes_from_its_cursor(atelier: AsyncClient) -> None:
    watching = atelier.watch_jobs()
    assert (await next_news(watching, is_snapshot_end)).cursor
    job = await submitted(atelier)
    seen = await next_news(watching, lambda m: m.job.job_id == job.job_id)
    await watching.aclose()  # the app goes away with its cursor
    saved = seen.cursor

    await atelier.cancel_job(job.job_id)  # changes while nobody watches
    final = await atelier.wait(job.job_id, timeout=60)

    resumed = atelier.watch_jobs(saved)
    snapshot = [m async for m in until_snapshot_end(resumed)]
    # A finished job is in the snapshot only because it changed since the cursor.
    mine = [m.job for m in snapshot if m.job.job_id == job.job_id]
    assert [j.version for j in mine] == [final.version]
    assert mine[0].status == job_pb2.JOB_STATUS_CANCELLED
    assert all(m.cursor and m.cursor != saved for m in snapshot)

    await atelier.delete_job(job.job_id)
    gone = await next_news(resumed, lambda m: m.job.job_id == job.job_id)
    assert gone.job.deleted and gone.job.version > final.version  # drop the job
    await resumed.aclose()


async def until_snapshot_end(
    watching: AsyncIterator[notify_service_pb2.WatchJobsResponse],
) -> AsyncIterator[notify_service_pb2.WatchJobsResponse]:
    while not is_snapshot_end(message := await asyncio.wait_for(anext(watching), 30)):
        yield message


DEVICE_TOKEN = "ab" * 32


async def test_devices_and_live_activities_register_list_and_delete(
    atelier: AsyncClient,
) -> None:
    fields = {
        "device_token": DEVICE_TOKEN,
        "environment": notify_service_pb2.APNS_ENVIRONMENT_SANDBOX,
        "bundle_id": "dev.atelier.app",
    }
    device = await atelier.register_device(**fields)
    assert (await atelier.register_device(**fields)).device_id == device.device_id
    listed = await atelier.list_devices()
    assert [d.device_id for d in listed.devices] == [device.device_id]

    job = await submitted(atelier)
    activity = await atelier.register_live_activity(
        job_id=job.job_id, device_id=device.device_id, push_token="cd" * 32, activity_id="a-1"
    )
    assert (activity.job_id, activity.activity_id) == (job.job_id, "a-1")
    await atelier.delete_live_activity(job.job_id, "a-1")
    with pytest.raises(NotFound):
        await atelier.delete_live_activity(job.job_id, "a-1")

    await atelier.delete_device(device.device_id)
    assert not (await atelier.list_devices()).devices
    with pytest.raises(NotFound) as raised:
        await atelier.delete_device(device.device_id)  # a first attempt's NOT_FOUND
    assert raised.value.reason == "DEVICE_NOT_FOUND"
    with pytest.raises(InvalidArgument) as bad:
        await atelier.register_device(**{**fields, "device_token": "not-hex"})
    assert [v.field for v in bad.value.field_violations] == ["device_token"]
    await atelier.cancel_job(job.job_id)

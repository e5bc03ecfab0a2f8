"""The crash matrix both worker kinds answer to: a worker killed with SIGKILL at each
point of an attempt (the stub's ATELIER_STUB_CRASH_AT), then a second worker that finds
the expired lease. Whatever the point, the job ends where DESIGN.md says, the provider
saw the submits it allows, the user is charged at most once, and no output landed in
media is left without a job to show it (jobs of two outputs, so a kill can fall between
them). tests/acceptance/test_worker_crashes.py runs it for in-process workers,
test_remote_workers.py for remote ones: the doomed worker is the test's, the rest here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.stacks import job_in
from tests.support.workers import WorkerProcess, exited

# (point, final status, points still reserved afterwards)
KILL_POINTS = [
    # Nothing reached the provider: the next worker runs a new attempt.
    ("before_submit", "JOB_STATUS_SUCCEEDED", 0),
    # The provider has the request, but its id was never stored: the outcome is
    # unknown, so an operator decides; no second submit, the points stay held. (The
    # survivors run with automatic recovery off, ATELIER_AUTO_ADOPT=none: with it on, the
    # reaper adopts the stub's request, which test_worker_crashes.py asserts apart.)
    ("after_submit", "JOB_STATUS_NEEDS_ATTENTION", 10),
    # The id was stored: the next worker resumes polling it.
    ("polling", "JOB_STATUS_SUCCEEDED", 0),
    # The first output's bytes were PUT but never committed (after_upload), one output
    # (after_output) or both (before_complete) landed: the next worker resumes the
    # attempt and lands onto the same assets (the uploaded object is committed as it is).
    ("after_upload", "JOB_STATUS_SUCCEEDED", 0),
    ("after_output", "JOB_STATUS_SUCCEEDED", 0),
    ("before_complete", "JOB_STATUS_SUCCEEDED", 0),
]
# The points where outputs have landed: a cancel then must delete them.
LANDED_POINTS = ["after_upload", "after_output", "before_complete"]

FINAL = {
    "JOB_STATUS_SUCCEEDED",
    "JOB_STATUS_FAILED",
    "JOB_STATUS_CANCELLED",
    "JOB_STATUS_NEEDS_ATTENTION",
}
OUTPUTS = 2  # each job makes two images, at the model's 5 points each

# (name, crash point or "") → a started worker process writing to the given ledger.
StartWorker = Callable[[str, str], WorkerProcess]


async def ai_outputs(api: Stack, owner: str) -> dict[str, str]:
    """Every ai_output asset media holds for ``owner``, deleted ones too: id → status."""
    engine = create_async_engine(asyncpg_url(api.database_url))
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT asset_id::text, status FROM media.assets"
                    " WHERE owner_user_id = :o AND purpose = 'ai_output'"
                ),
                {"o": owner},
            )
            return {row.asset_id: row.status for row in rows}
    finally:
        await engine.dispose()


async def submit(api: Stack, http: httpx.AsyncClient) -> tuple[User, str]:
    """A new user's job of OUTPUTS images through the edge: (user, job id)."""
    user = User()
    asset = await put_input(api, user.user_id)
    body = job_body(asset, numOutputs=OUTPUTS)
    url = f"http://127.0.0.1:{api.ports.envoy}"
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=body)
    return user, str(submitted.json()["job"]["jobId"])


async def killed_at_a_point(
    api: Stack,
    http: httpx.AsyncClient,
    ledger: Path,
    start: StartWorker,
    point: str,
    final: str,
    reserved: int,
) -> str:
    """One row of KILL_POINTS: a worker ``start`` makes dies at ``point``; a second one
    (also ``start``'s, without a crash point) finishes what the reaper hands it. The
    job's id, for what a test asserts beyond the matrix."""
    url = f"http://127.0.0.1:{api.ports.envoy}"
    user, job_id = await submit(api, http)
    doomed = start(f"crash-{point}", point)
    assert await exited(doomed, within=30) == -9  # SIGKILL, as a power cut
    survivor = start(f"after-{point}", "")
    try:
        job = await job_in(http, url, user.headers, job_id, FINAL, within=40)
    finally:
        assert survivor.stop() == 0

    assert job["status"] == final, job
    assert len(read_ledger(ledger).get(job_id, [])) == 1  # the provider saw one submit
    # 100 welcome points, a price of 2 x 5: captured once on success, held for the operator.
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (90, reserved)
    outputs = [output["assetId"] for output in job.get("outputs", [])]
    if final == "JOB_STATUS_SUCCEEDED":
        assert len(outputs) == OUTPUTS
        for output in job["outputs"]:
            assert (await http.get(output["url"])).status_code == 200
    # Not one ai_output asset beyond the job's own: none orphaned, none landed twice.
    assert await ai_outputs(api, user.user_id) == dict.fromkeys(outputs, "ready")
    return job_id


async def cancelled_after_landed_outputs(
    api: Stack,
    http: httpx.AsyncClient,
    start: StartWorker,
    point: str,
    landed_as: list[str] | None = None,
) -> None:
    """The worker dies with outputs landed, media holding them as ``landed_as`` says
    (by default: one uploading after_upload, one ready after_output, both ready
    before_complete, as an in-process worker lands them one by one); the owner cancels;
    the reaper cancels the job (telling the provider) and deletes what the dead worker
    landed: nothing orphaned, the points released."""
    url = f"http://127.0.0.1:{api.ports.envoy}"
    user, job_id = await submit(api, http)
    doomed = start(f"cancel-{point}", point)
    assert await exited(doomed, within=30) == -9
    landed = await ai_outputs(api, user.user_id)
    if landed_as is None:
        landed_as = {
            "after_upload": ["uploading"],
            "after_output": ["ready"],
        }.get(point, ["ready"] * OUTPUTS)
    assert sorted(landed.values()) == landed_as
    cancel = await http.post(f"{url}/v1/jobs/{job_id}:cancel", headers=user.headers, json={})
    assert cancel.json()["job"]["cancelRequested"] is True

    survivor = start(f"reaps-{point}", "")
    try:
        job = await job_in(http, url, user.headers, job_id, FINAL, within=40)
        assert job["status"] == "JOB_STATUS_CANCELLED" and not job.get("outputs")
        # The reaper's sweep purges right after it cancels.
        deadline = time.monotonic() + 10
        while set((await ai_outputs(api, user.user_id)).values()) != {"deleted"}:
            assert time.monotonic() < deadline, await ai_outputs(api, user.user_id)
            await asyncio.sleep(0.1)
    finally:
        assert survivor.stop() == 0
    assert set(await ai_outputs(api, user.user_id)) == set(landed)  # nothing new landed
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (100, 0)

"""Hosted-vendor jobs for acceptance tests: a fake vendor (tests/support/fakes) in a thread
of the test process, a catalog model of that vendor enabled on the API's database, and
real worker processes (`atelier serve creation --role worker`) pointed at the fake.

The scenarios every vendor must pass live here; tests/acceptance/test_replicate_jobs.py
and test_fal_jobs.py run them against their vendor's fake, with the vendor's own ways of
failing. Each job's prompt carries a marker, so the submits the fake saw for one job are
counted by it whatever else ran before.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from PIL import Image, ImageOps
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Job
from services.creation.providers.hosted.http import PROCESS_HEADER
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support import pictures
from tests.support.fakes.fal_api import FalFake
from tests.support.fakes.replicate_api import ReplicateFake
from tests.support.fakes.vendor import Generation, Submit, VendorFake
from tests.support.stacks import job_in
from tests.support.workers import WorkerProcess, read_jobs, serving, start_worker

REPLICATE_TOKEN = "r8_acceptance_token_0123456789"
FAL_KEY = "acceptance-key-id:acceptance-key-secret"
FINAL = {
    "JOB_STATUS_SUCCEEDED",
    "JOB_STATUS_FAILED",
    "JOB_STATUS_CANCELLED",
    "JOB_STATUS_NEEDS_ATTENTION",
}
# Short leases, beats, polls and backoffs: a test sees a whole job, a retry or a dead
# worker's job found again within seconds.
ENGINE_ENV = {
    "ATELIER_ENV": "test",
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
    "ATELIER_PROGRESS_INTERVAL": "0.1",
    "ATELIER_WORKER_POLL": "0.3",
    "ATELIER_WORKER_PROVIDER_POLL": "0.1",
    "ATELIER_BACKOFF_BASE": "0.2",
    "ATELIER_BACKOFF_MAX": "1",
    "ATELIER_PROVIDER_REQUEST_TIMEOUT": "5",
    # Few connections: the machine's PostgreSQL is shared (100 connections in all).
    "ATELIER_DB_POOL_SIZE": "6",
}


@dataclass(frozen=True)
class Vendor:
    code: str
    model_id: str  # the catalog row migration 0009 seeds (disabled)
    price: int
    make_fake: Callable[[], VendorFake]
    base_url_setting: str
    key_setting: str
    key: str
    prompt_of: Callable[[Mapping[str, Any]], str]  # a submit's body -> its prompt
    poll: str  # the fake's name for a status read

    def env(self, fake: VendorFake) -> dict[str, str]:
        return {self.base_url_setting: fake.url, self.key_setting: self.key}


REPLICATE = Vendor(
    code="replicate",
    model_id="replicate-kontext",
    price=20,
    make_fake=lambda: ReplicateFake(REPLICATE_TOKEN, tag_header=PROCESS_HEADER),
    base_url_setting="ATELIER_REPLICATE_BASE_URL",
    key_setting="ATELIER_REPLICATE_API_TOKEN",
    key=REPLICATE_TOKEN,
    prompt_of=lambda body: str(body.get("input", {}).get("prompt", "")),
    poll="get",
)
FAL = Vendor(
    code="fal",
    model_id="fal-kontext",
    price=20,
    make_fake=lambda: FalFake(FAL_KEY, tag_header=PROCESS_HEADER),
    base_url_setting="ATELIER_FAL_QUEUE_URL",
    key_setting="ATELIER_FAL_KEY",
    key=FAL_KEY,
    prompt_of=lambda body: str(body.get("prompt", "")),
    poll="status",
)


@contextmanager
def running_fake(vendor: Vendor) -> Iterator[VendorFake]:
    fake = vendor.make_fake()
    fake.pace(start_delay=0.05, duration=0.4, steps=10)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


async def enable_models(database_url: str, *model_ids: str, disable: Sequence[str] = ()) -> None:
    """Flips the seeded rows on (and ``disable`` off), as an operator does
    (docs/providers.md). A worker refuses to start while an enabled model's vendor has no
    key, so a worker configured for one vendor needs the other's models off."""
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        async with engine.begin() as connection:
            changed = await connection.execute(
                text("UPDATE creation.models SET enabled = true WHERE model_id = ANY(:ids)"),
                {"ids": list(model_ids)},
            )
            assert changed.rowcount == len(model_ids), "the seeded hosted models are missing"
            await connection.execute(
                text("UPDATE creation.models SET enabled = false WHERE model_id = ANY(:ids)"),
                {"ids": list(disable)},
            )
    finally:
        await engine.dispose()


def worker_env(fakes: Mapping[Vendor, VendorFake], **extra: str) -> dict[str, str]:
    env = dict(ENGINE_ENV)
    for vendor, fake in fakes.items():
        env.update(vendor.env(fake))
    env.update(extra)
    return env


@dataclass
class Hosted:
    """One vendor's fake, the API stack whose database has the vendor's model enabled,
    and a worker (or several) pointed at the fake."""

    api: Stack
    vendor: Vendor
    fake: VendorFake
    db: AsyncEngine
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api.ports.envoy}"

    def start_worker(self, name: str, **extra: str) -> WorkerProcess:
        worker = start_worker(self.api, name, worker_env({self.vendor: self.fake}, **extra))
        self.workers.append(worker)
        return worker

    def submits_for(self, marker: str) -> list[Submit]:
        with self.fake.lock:
            return [s for s in self.fake.submits if marker in self.vendor.prompt_of(s.body)]

    def generation_for(self, marker: str) -> Generation:
        [submit] = self.submits_for(marker)
        return self.fake.generations[submit.generation_id]

    async def job(self, job_id: str) -> Job:
        return (await read_jobs(self.db, [job_id]))[job_id]


@asynccontextmanager
async def hosted_alone(api: Stack, vendor: Vendor) -> AsyncIterator[Hosted]:
    """The vendor's fake, with only this vendor's hosted model enabled (a worker refuses
    to start while an enabled model's vendor has no key) and no worker yet; every worker
    started through it stops at the end."""
    others = [other.model_id for other in (REPLICATE, FAL) if other is not vendor]
    await enable_models(api.database_url, vendor.model_id, disable=others)
    with running_fake(vendor) as fake:
        engine = create_async_engine(asyncpg_url(api.database_url))
        hosted = Hosted(api, vendor, fake, engine)
        try:
            yield hosted
        finally:
            fake.release()
            for worker in hosted.workers:
                if worker.child.alive():
                    worker.stop()
            await engine.dispose()


@asynccontextmanager
async def hosted_with_worker(api: Stack, vendor: Vendor) -> AsyncIterator[Hosted]:
    """The vendor's fake and one worker for a module's tests (each test's own job)."""
    async with hosted_alone(api, vendor) as hosted:
        await serving(hosted.start_worker(f"{vendor.code}-worker"))
        yield hosted


@dataclass
class Submitted:
    user: User
    job_id: str
    marker: str
    photo: bytes


async def submit(hosted: Hosted, http: httpx.AsyncClient, **changes: object) -> Submitted:
    """A job of the vendor's model, through Envoy as the app sends it, with a photo of its
    own and a marker in its prompt."""
    user = User()
    photo = pictures.encode(pictures.scene())
    asset = await put_input(hosted.api, user.user_id, data=photo)
    marker = uuid.uuid4().hex
    body = job_body(asset, modelId=hosted.vendor.model_id, prompt=f"a fox {marker}", **changes)
    answer = await http.post(f"{hosted.url}/v1/jobs", headers=user.headers, json=body)
    assert answer.status_code == 200, answer.text
    return Submitted(user, answer.json()["job"]["jobId"], marker, photo)


async def final(
    hosted: Hosted, http: httpx.AsyncClient, job: Submitted, within: float = 30
) -> dict[str, Any]:
    return await job_in(http, hosted.url, job.user.headers, job.job_id, FINAL, within)


async def balance(hosted: Hosted, http: httpx.AsyncClient, user: User) -> tuple[int, int]:
    answer = (await http.get(f"{hosted.url}/v1/balance", headers=user.headers)).json()
    return answer["availablePoints"], answer["reservedPoints"]


def styled(photo: bytes) -> Image.Image:
    """What the fakes' model makes of a photo."""
    return ImageOps.mirror(ImageOps.invert(pictures.decode(photo)))


# ---- the scenarios every vendor passes -------------------------------------------------


async def a_job_runs_to_the_vendors_picture(hosted: Hosted, http: httpx.AsyncClient) -> None:
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert done["progressPercent"] == 100 and done["attempt"] == 1
    [submitted] = hosted.submits_for(job.marker)
    # The photo went inline (local storage reaches no vendor) and came back styled.
    [output] = done["outputs"]
    download = await http.get(output["url"])
    assert download.status_code == 200
    assert pictures.mean_difference(pictures.decode(download.content), styled(job.photo)) < 2
    stored = await hosted.job(job.job_id)
    assert hosted.fake.generations[submitted.generation_id].id in str(stored.provider_request_id)
    assert await balance(hosted, http, job.user) == (100 - hosted.vendor.price, 0)


async def progress_reaches_the_job(hosted: Hosted, http: httpx.AsyncClient) -> None:
    """The vendor's own progress (its logs) shows on the running job."""
    hosted.fake.hold(progress=40)
    try:
        job = await submit(hosted, http)
        running = await job_with_progress(hosted, http, job, 40)
        assert running["status"] == "JOB_STATUS_RUNNING"
    finally:
        hosted.fake.release()
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED" and done["progressPercent"] == 100


async def job_with_progress(
    hosted: Hosted, http: httpx.AsyncClient, job: Submitted, percent: int, within: float = 20
) -> dict[str, Any]:
    """The job, read through the edge, once its progress is ``percent``."""
    deadline = time.monotonic() + within
    while True:
        current: dict[str, Any] = (
            await http.get(f"{hosted.url}/v1/jobs/{job.job_id}", headers=job.user.headers)
        ).json()["job"]
        if current.get("progressPercent") == percent:
            return current
        assert time.monotonic() < deadline, f"progress stayed {current.get('progressPercent')}"
        await asyncio.sleep(0.05)


async def a_provider_failure_fails_the_job(
    hosted: Hosted, http: httpx.AsyncClient, code: str
) -> None:
    """The fake was told how to fail the next generation; the job fails with ``code``,
    after one submit, and the user gets the points back."""
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_FAILED", done
    assert (await hosted.job(job.job_id)).error_code == code
    assert len(hosted.submits_for(job.marker)) == 1
    assert await balance(hosted, http, job.user) == (100, 0)


async def a_retryable_failure_runs_a_second_attempt(
    hosted: Hosted, http: httpx.AsyncClient
) -> None:
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert done["attempt"] == 2
    first, second = hosted.submits_for(job.marker)
    assert hosted.fake.phase_of(first.generation_id) == "failed"
    assert hosted.fake.phase_of(second.generation_id) == "succeeded"


async def a_throttled_submit_waits_retry_after(hosted: Hosted, http: httpx.AsyncClient) -> None:
    """429 with Retry-After on the submit: the job succeeds, submitted again no earlier
    than the vendor asked, with one generation at the vendor."""
    before = len(hosted.fake.requests_for("create"))
    hosted.fake.throttle(times=1, retry_after=2, on=["create"])
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert len(hosted.submits_for(job.marker)) == 1
    throttled, accepted = hosted.fake.requests_for("create")[before:]
    assert (throttled.status, accepted.status) in ((429, 201), (429, 200))
    waited = accepted.at - throttled.at
    assert waited >= 1.9, f"submitted again {waited:.2f} s after a 429 asking for 2 s"


async def a_throttled_poll_waits_retry_after(hosted: Hosted, http: httpx.AsyncClient) -> None:
    """429 with Retry-After on a status read: the next read of that request comes no
    earlier than the vendor asked, and the job succeeds without a second submit."""
    poll = hosted.vendor.poll
    before = len(hosted.fake.requests_for(poll))
    hosted.fake.throttle(times=1, retry_after=2, on=[poll])
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert len(hosted.submits_for(job.marker)) == 1
    throttled, following = hosted.fake.requests_for(poll)[before : before + 2]
    assert throttled.status == 429
    waited = following.at - throttled.at
    assert waited >= 1.9, f"polled again {waited:.2f} s after a 429 asking for 2 s"


async def server_errors_then_success(hosted: Hosted, http: httpx.AsyncClient) -> None:
    """A 500 on the submit (nothing created) and two 502s on polls: the job succeeds with
    exactly one generation at the vendor."""
    hosted.fake.server_errors(times=1, status=500, on=["create"])
    hosted.fake.server_errors(times=2, status=502, on=[hosted.vendor.poll])
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert len(hosted.submits_for(job.marker)) == 1
    polls = hosted.fake.requests_for(hosted.vendor.poll)
    assert sum(1 for r in polls if r.status == 502) >= 2


async def cancel_mid_run_reaches_the_vendor(hosted: Hosted, http: httpx.AsyncClient) -> None:
    hosted.fake.hold(progress=30)
    try:
        job = await submit(hosted, http)
        await job_with_progress(hosted, http, job, 30)
        generation = hosted.generation_for(job.marker)
        cancel = await http.post(
            f"{hosted.url}/v1/jobs/{job.job_id}:cancel", headers=job.user.headers, json={}
        )
        assert cancel.status_code == 200, cancel.text
        done = await final(hosted, http, job)
    finally:
        hosted.fake.release()
    assert done["status"] == "JOB_STATUS_CANCELLED", done
    assert generation.id in hosted.fake.cancels
    assert hosted.fake.phase_of(generation.id) == "canceled"
    assert await balance(hosted, http, job.user) == (100, 0)


async def an_expired_output_fails_the_job(hosted: Hosted, http: httpx.AsyncClient) -> None:
    """The output URL is dead when the generation ends: terminal OUTPUT_EXPIRED (the
    adapters' documented choice: a retry would pay for a second generation)."""
    hosted.fake.expire_outputs_at_completion()
    try:
        job = await submit(hosted, http)
        done = await final(hosted, http, job)
    finally:
        hosted.fake.expire_outputs_at_completion(False)
    assert done["status"] == "JOB_STATUS_FAILED", done
    assert (await hosted.job(job.job_id)).error_code == "OUTPUT_EXPIRED"
    assert len(hosted.submits_for(job.marker)) == 1
    assert any(r.status == 404 for r in hosted.fake.requests_for("file"))
    assert not done.get("outputs")


async def a_refused_key_fails_the_job_without_showing_it(
    hosted: Hosted, http: httpx.AsyncClient
) -> None:
    """The vendor stops accepting our key (revoked, rotated): the vendor's 401 fails the
    job for good (every attempt would be refused alike), the key shows nowhere."""
    accepted = hosted.fake.token
    hosted.fake.token = "a-rotated-key-we-do-not-have"
    try:
        job = await submit(hosted, http)
        done = await final(hosted, http, job)
    finally:
        hosted.fake.token = accepted
    assert done["status"] == "JOB_STATUS_FAILED", done
    stored = await hosted.job(job.job_id)
    assert stored.error_code == "AUTH_REJECTED"
    assert hosted.vendor.key not in str(stored.error_message)
    assert hosted.vendor.key not in str(done)
    assert hosted.submits_for(job.marker) == []
    assert await balance(hosted, http, job.user) == (100, 0)


def the_key_is_in_no_log(hosted: Hosted) -> None:
    """After every call the module's worker made, its log never showed the vendor key."""
    for worker in hosted.workers:
        assert worker.child.log_path is not None
        assert hosted.vendor.key not in worker.child.log_path.read_text(errors="replace")


async def a_lost_submit_needs_attention(
    hosted: Hosted, http: httpx.AsyncClient, mode: str = "close"
) -> None:
    """The vendor accepts the submit and its answer never comes (``close``: the
    connection drops; ``hang``: nothing until the worker's request timeout): the job waits
    for an operator, the generation runs at the vendor, and nothing submits again."""
    hosted.fake.lose_submit_responses(mode=mode, hang_seconds=30)
    job = await submit(hosted, http)
    done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_NEEDS_ATTENTION", done
    [lost] = hosted.submits_for(job.marker)
    assert lost.response_lost
    # The orphan runs to its end at the vendor; still nobody submitted it again.
    await hosted.fake.wait_for_async(
        lambda: hosted.fake.phase_of(lost.generation_id) == "succeeded", within=10
    )
    assert len(hosted.submits_for(job.marker)) == 1
    assert await balance(hosted, http, job.user) == (
        100 - hosted.vendor.price,
        hosted.vendor.price,
    )

"""The engine as `atelier serve creation` assembles it: roles worker and all run the
worker and the reaper when given a provider registry; a job submitted over creation's
public gRPC runs to SUCCEEDED through the real media service, and its output downloads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc, job_pb2
from services.creation.app import build
from services.creation.media_client import MediaClient
from services.creation.providers.base import Provider
from services.kit.server import RunningService
from services.kit.settings import DEV_SERVICE_TOKEN, ListenSettings
from tests.integration.creation.helpers import new_user, user_token
from tests.integration.creation.worker_kit import FakeProvider, engine_settings, output_png
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media


@pytest.fixture
async def media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path)) as running:
        yield running


def test_roles_worker_and_all_run_the_engine_given_a_registry(creation_url: str) -> None:
    settings = engine_settings(creation_url, "127.0.0.1:1")
    providers: dict[str, Provider] = {"stub": FakeProvider()}

    def names(role: str, given: dict[str, Provider] | None) -> list[str]:
        return [c.name for c in build(settings, role, providers=given).components]

    engine = ["worker", "reaper", "outbox-relay", "webhook-deliverer", "backlog-gauges"]
    assert names("worker", providers) == engine
    assert names("all", providers) == [*engine, "job-waits"]
    # Every role writes job changes, so every role relays them to notify and delivers
    # their webhooks; the roles that own the queue read its gauges; the roles that answer
    # calls wake the waiting ones.
    assert names("api", providers) == ["outbox-relay", "webhook-deliverer", "job-waits"]
    # No registry wired in: jobs wait, and the gauges show them waiting.
    assert names("all", None) == [
        "outbox-relay",
        "webhook-deliverer",
        "backlog-gauges",
        "job-waits",
    ]


def succeeded_attempts() -> float:
    sample = REGISTRY.get_sample_value("atelier_worker_attempts_total", {"outcome": "succeeded"})
    return sample or 0.0


async def test_a_job_submitted_over_grpc_runs_to_succeeded(
    engine: AsyncEngine, creation_url: str, media: MediaHarness
) -> None:
    media_address = f"127.0.0.1:{media.running.internal_port}"
    settings = engine_settings(creation_url, media_address, DRAIN_GRACE="2", WELCOME_POINTS="100")
    provider = FakeProvider()
    app = build(settings, "all", providers={"stub": provider})
    running = RunningService(app, settings.common, ListenSettings(0, 0, 0))
    succeeded_before = succeeded_attempts()
    await running.start()
    try:
        user = new_user()
        client = MediaClient(media_address, DEV_SERVICE_TOKEN)
        asset = await client.put_asset(user, "ai_input", "image/png", image_bytes("PNG"))
        await client.close()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}") as channel:
            stub = creation_service_pb2_grpc.CreationServiceStub(channel)
            submitted = await stub.SubmitJob(
                creation_service_pb2.SubmitJobRequest(
                    model_id="stub-fast",
                    style_id="watercolor",
                    input_asset_id=asset,
                    prompt="a cat",
                    width=512,
                    height=512,
                ),
                metadata=user_token(user),
            )
            deadline = time.monotonic() + 15
            while True:
                got = await stub.GetJob(
                    creation_service_pb2.GetJobRequest(job_id=submitted.job.job_id),
                    metadata=user_token(user),
                )
                if got.job.status == job_pb2.JOB_STATUS_SUCCEEDED:
                    break
                assert time.monotonic() < deadline, got.job
                await asyncio.sleep(0.02)
    finally:
        await running.stop()
    # Its attempt is counted by outcome (the line saying so is DEBUG).
    assert succeeded_attempts() == succeeded_before + 1
    assert len(got.job.outputs) == 1 and got.job.outputs[0].asset_id
    assert got.job.progress_percent == 100
    async with httpx.AsyncClient() as http:
        downloaded = await http.get(got.job.outputs[0].url)
    assert downloaded.status_code == 200
    assert downloaded.content == output_png().data
    assert len(provider.submits) == 1

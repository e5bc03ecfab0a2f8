"""Whole stacks for acceptance tests that need one of their own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from services.dev import postgres
from services.dev.stack import Stack, StackPorts


@contextmanager
def stack_of_its_own(
    admin_url: str,
    work: Path,
    creation_role: str,
    extra_env: dict[str, str],
    *,
    apns_peer: bool = False,
    console: bool = False,
) -> Iterator[Stack]:
    """A whole stack on a database of its own: a job engine there must not take the jobs of
    the shared stack's tests. With ``apns_peer`` notify sends its pushes to the local APNs
    peer (its log: logs/apns-peer.log); with ``console`` the operator's console runs beside
    it."""
    name = f"atelier_own_{uuid.uuid4().hex[:10]}"
    url = postgres.ensure_database(admin_url, name)
    running = Stack(
        database_url=url,
        ports=StackPorts.free(),
        work_dir=work,
        log_dir=work / "logs",
        creation_role=creation_role,
        extra_env=extra_env,
        apns_peer=apns_peer,
        console=console,
    )
    running.migrate()
    running.start()
    try:
        yield running
    finally:
        running.stop()
        postgres.drop_database(admin_url, name)


async def job_in(
    http: httpx.AsyncClient,
    edge_url: str,
    headers: Mapping[str, str],
    job_id: str,
    statuses: Collection[str],
    within: float,
) -> dict[str, Any]:
    """The job, read through the edge, as soon as its status is one of ``statuses``;
    fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        job: dict[str, Any] = (
            await http.get(f"{edge_url}/v1/jobs/{job_id}", headers=dict(headers))
        ).json()["job"]
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"still {job['status']} after {within} s"
        await asyncio.sleep(0.05)


async def job_with_thumbnails(
    http: httpx.AsyncClient,
    edge_url: str,
    headers: Mapping[str, str],
    job_id: str,
    within: float = 30.0,
) -> dict[str, Any]:
    """The succeeded job, read through the edge, once every output carries its thumbnail
    URL: media makes thumbnails in the background, after the job succeeded (until then an
    output has its picture's URL only). Fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        job: dict[str, Any] = (
            await http.get(f"{edge_url}/v1/jobs/{job_id}", headers=dict(headers))
        ).json()["job"]
        outputs = job.get("outputs", [])
        if job["status"] == "JOB_STATUS_SUCCEEDED" and all(o.get("thumbnailUrl") for o in outputs):
            return job
        assert time.monotonic() < deadline, f"no thumbnails after {within} s: {job}"
        await asyncio.sleep(0.05)

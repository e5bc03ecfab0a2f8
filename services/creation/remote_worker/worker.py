"""The reference remote worker's loop: ``concurrency`` slots each claim a job and run it
as a :class:`RemoteAttempt`; on SIGTERM it drains: no more claims, jobs not yet at the
provider are handed back at once, polling ones get until the drain deadline, then are
handed back (their request kept)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping

import httpx

from services.creation.providers.base import Provider
from services.creation.remote_worker.attempt import RemoteAttempt
from services.creation.remote_worker.client import Refused, WorkerClient
from services.creation.remote_worker.settings import RemoteWorkerSettings
from services.creation.worker.context import Drain, PointHook, no_point
from services.creation.worker.driver import PollPolicy
from services.kit import event_loop
from services.kit.event_loop import DEFAULT_EVENT_LOOP, EVENT_LOOPS
from services.kit.logging import get_logger
from services.kit.tls import channel_credentials

log = get_logger(__name__)

CLAIM_RETRY_SECONDS = 1.0
# The first health call, before any claim: a certificate this worker does not trust
# stops it at once, with its reason, instead of a claim refused again and again.
REACH_TIMEOUT_SECONDS = 10.0


class RemoteWorker:
    """``concurrency`` slots, each claiming a job, running it and claiming again: claims
    go out in parallel (one round trip each), never more jobs held than slots."""

    def __init__(
        self,
        client: WorkerClient,
        providers: Mapping[str, Provider],
        settings: RemoteWorkerSettings,
        on_point: PointHook = no_point,
    ) -> None:
        self._client = client
        self._on_point = on_point
        self._providers = providers
        self._settings = settings
        self._drain = Drain()
        self._policy = PollPolicy(
            settings.provider_poll_seconds,
            settings.backoff_base_seconds,
            settings.backoff_max_seconds,
        )
        self.outcomes: dict[str, str] = {}

    def stop(self) -> None:
        """Begins the drain (SIGTERM)."""
        if self._drain.asked.is_set():
            return
        self._drain.asked.set()
        asyncio.get_running_loop().call_later(self._settings.drain_seconds, self._drain.due.set)

    async def run(self) -> None:
        log.info(
            "worker_started",
            worker_id=self._client.worker_id,
            concurrency=self._settings.concurrency,
            remote=True,
        )
        async with httpx.AsyncClient(timeout=30) as http:
            slots = [
                asyncio.create_task(self._slot(http), name=f"slot-{n}")
                for n in range(self._settings.concurrency)
            ]
            try:
                await asyncio.gather(*slots)
            finally:
                for slot in slots:
                    slot.cancel()
                await asyncio.gather(*slots, return_exceptions=True)
        log.info("worker_stopped", worker_id=self._client.worker_id)

    async def _slot(self, http: httpx.AsyncClient) -> None:
        while not self._drain.asked.is_set():
            try:
                job, lease = await self._client.claim()
            except Refused as refused:
                log.warning("claim_refused", reason=refused.reason, code=refused.code.name)
                await self._sleep(CLAIM_RETRY_SECONDS)
                continue
            if job is None or lease is None:
                await self._sleep(self._settings.poll_seconds)
                continue
            attempt = RemoteAttempt(
                job,
                lease,
                self._client,
                self._providers,
                http,
                self._drain,
                self._policy,
                self._on_point,
            )
            try:
                self.outcomes[job.job_id] = await attempt.run()
            except Exception as error:
                # A bug or an answer we cannot use: the lease runs out and the reaper
                # decides by the job's step.
                log.error("remote_attempt_crashed", job_id=job.job_id, error=repr(error))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain.asked.wait(), seconds)


def _handshake_failed(problem: str) -> bool:
    # grpc says no more than this (the certificate's fault is in its own log): the
    # server answered, but not with a certificate this worker trusts (or not in TLS).
    return "handshake" in problem.lower() or "ssl" in problem.lower()


async def serve(
    settings: RemoteWorkerSettings,
    providers: Mapping[str, Provider],
    on_point: PointHook = no_point,
) -> int:
    """Runs the worker until SIGTERM or SIGINT, then drains; the exit code (2 when the
    server's certificate is not trusted: no retry fixes that)."""
    tls = channel_credentials(settings.ca) if settings.uses_tls else None
    client = WorkerClient(
        settings.address,
        settings.credential,
        settings.worker_id,
        settings.fault,
        settings.lease_seconds,
        tls=tls,
    )
    worker = RemoteWorker(client, providers, settings, on_point)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        problem = await client.reach(REACH_TIMEOUT_SECONDS)
        if problem is not None and tls is not None and _handshake_failed(problem):
            log.error(
                "remote_tls_refused",
                address=settings.address,
                ca=str(settings.ca) if settings.ca else "system roots",
                problem=problem,
                hint="the server's certificate does not chain to ATELIER_REMOTE_WORKER_CA "
                "(or names another host), or the address is not a TLS listener",
            )
            return 2
        if problem is not None:
            # Down or unreachable for now: the claims retry until it answers.
            log.warning("remote_unreachable", address=settings.address, problem=problem)
        await worker.run()
    finally:
        await client.close()
        for provider in providers.values():
            await provider.close()
    return 0


def main(address: str = "") -> int:
    """`atelier worker [--remote ADDRESS]`: the stub provider (settings ATELIER_STUB_*)
    through the protocol. Any adapter with the Provider interface can be added here."""
    import functools

    from services.creation.providers.stub import StubProvider, crash_point
    from services.creation.settings import StubSettings
    from services.kit.logging import configure
    from services.kit.settings import EnvReader

    reader = EnvReader()
    settings = RemoteWorkerSettings.read(reader, address)
    stub = StubSettings.read(reader)
    level = reader.string("LOG_LEVEL", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    loop = reader.string("EVENT_LOOP", DEFAULT_EVENT_LOOP, choices=EVENT_LOOPS)
    reader.require(bool(settings.credential), "REMOTE_WORKER_CREDENTIAL", "is required")
    reader.finish()
    configure(level, "remote-worker")
    # httpx logs every request at INFO, signed input URLs included: keep them out.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    providers: dict[str, Provider] = {"stub": StubProvider(stub)}
    # ATELIER_STUB_CRASH_AT: the crash matrix's points, as for an in-process worker.
    on_point: PointHook = no_point
    if stub.crash_at:
        on_point = functools.partial(crash_point, crash_at=stub.crash_at)
    log.info(
        "remote_worker_dialing",
        address=settings.address,
        tls=settings.uses_tls,
        ca=str(settings.ca) if settings.ca else None,
    )
    return event_loop.run(serve(settings, providers, on_point), loop)

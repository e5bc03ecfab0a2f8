"""The reference remote worker's loop: claims one job at a time while it has a free slot
(at most ``concurrency`` running), runs each as a :class:`RemoteAttempt`, and on SIGTERM
drains: no more claims, jobs not yet at the provider are handed back at once, polling
ones get until the drain deadline, then are handed back (their request kept)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping

import httpx

from services.creation.providers.base import Provider
from services.creation.remote_worker.attempt import RemoteAttempt, RemoteDrain
from services.creation.remote_worker.client import Refused, WorkerClient
from services.creation.remote_worker.settings import RemoteWorkerSettings
from services.kit.logging import get_logger

log = get_logger(__name__)

CLAIM_RETRY_SECONDS = 1.0


class RemoteWorker:
    def __init__(
        self,
        client: WorkerClient,
        providers: Mapping[str, Provider],
        settings: RemoteWorkerSettings,
    ) -> None:
        self._client = client
        self._providers = providers
        self._settings = settings
        self._drain = RemoteDrain()
        self._attempts: set[asyncio.Task[str]] = set()
        self._slot_freed = asyncio.Event()
        self.outcomes: dict[str, str] = {}

    def stop(self) -> None:
        """Begins the drain (SIGTERM)."""
        if self._drain.asked.is_set():
            return
        self._drain.asked.set()
        self._slot_freed.set()
        asyncio.get_running_loop().call_later(self._settings.drain_seconds, self._drain.due.set)

    async def run(self) -> None:
        log.info(
            "worker_started",
            worker_id=self._client.worker_id,
            concurrency=self._settings.concurrency,
            remote=True,
        )
        async with httpx.AsyncClient(timeout=30) as http:
            while not self._drain.asked.is_set():
                if len(self._attempts) >= self._settings.concurrency:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
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
                    self._settings.provider_poll_seconds,
                )
                self._start(job.job_id, attempt)
            if self._attempts:
                log.info("worker_draining", running=len(self._attempts))
                await asyncio.gather(*self._attempts, return_exceptions=True)
        log.info("worker_stopped", worker_id=self._client.worker_id)

    def _start(self, job_id: str, attempt: RemoteAttempt) -> None:
        task = asyncio.create_task(attempt.run(), name=f"remote:{job_id}")
        self._attempts.add(task)

        def ended(done: asyncio.Task[str]) -> None:
            self._attempts.discard(done)
            if not done.cancelled() and done.exception() is None:
                self.outcomes[job_id] = done.result()
            elif not done.cancelled():
                log.error("remote_attempt_crashed", job_id=job_id, error=repr(done.exception()))
            self._slot_freed.set()

        task.add_done_callback(ended)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain.asked.wait(), seconds)


async def serve(
    address: str, settings: RemoteWorkerSettings, providers: Mapping[str, Provider]
) -> int:
    """Runs the worker until SIGTERM or SIGINT, then drains; the exit code."""
    client = WorkerClient(address, settings.credential, settings.worker_id, settings.fault)
    worker = RemoteWorker(client, providers, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await client.close()
        for provider in providers.values():
            await provider.close()
    return 0


def main(address: str) -> int:
    """`atelier worker --remote ADDRESS`: the stub provider (settings ATELIER_STUB_*)
    through the protocol. Any adapter with the Provider interface can be added here."""
    from services.creation.providers.stub import StubProvider
    from services.creation.settings import StubSettings
    from services.kit.logging import configure
    from services.kit.settings import EnvReader

    reader = EnvReader()
    settings = RemoteWorkerSettings.read(reader)
    stub = StubSettings.read(reader)
    level = reader.string("LOG_LEVEL", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    reader.require(bool(settings.credential), "REMOTE_WORKER_CREDENTIAL", "is required")
    reader.finish()
    configure(level, "remote-worker")
    providers: dict[str, Provider] = {"stub": StubProvider(stub)}
    return asyncio.run(serve(address, settings, providers))

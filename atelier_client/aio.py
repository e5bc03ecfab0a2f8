"""The asyncio client: atelier's public calls over ``grpc.aio`` channels.

    async with AsyncClient.connect("127.0.0.1:8080", token=token) as atelier:
        job = await atelier.submit(model_id="stub-fast", style_id="watercolor", ...)
        final = await atelier.wait(job.job_id, timeout=120)

No interceptors: grpc.aio runs an intercepted call in a task of its own, which would cost
every call more than the client's own work.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import grpc

from atelier.creation.v1 import creation_service_pb2 as creation
from atelier.creation.v1 import job_pb2
from atelier.media.v1 import asset_pb2
from atelier.media.v1 import media_service_pb2 as media
from atelier_client import calls, upload
from atelier_client.auth import Token
from atelier_client.calls import Out
from atelier_client.core import CHANNEL_OPTIONS, DEFAULT_WAIT, ClientBase, Core
from atelier_client.retry import RetryHook, RetryPolicy
from atelier_client.watch import JobState, StateHook


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """atelier's public calls; typed errors (:mod:`atelier_client.errors`), retries as
    :mod:`atelier_client.retry` says; channels as :class:`ClientBase` says."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        token: Token,
        media_channel: grpc.aio.Channel | None = None,
        notify_channel: grpc.aio.Channel | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 frozen
        on_retry: RetryHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        core = Core(token, retry, on_retry, clock, rng)
        super().__init__(channel, media_channel, notify_channel, core)
        self._sleep = sleep

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        token: Token,
        media: str | None = None,
        notify: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        **settings: Any,
    ) -> Self:
        """A client on channels of its own (closed by :meth:`close`): ``target`` for
        creation, and for media and notify unless they have addresses of their own."""

        def open_channel(address: str) -> grpc.aio.Channel:
            if credentials is None:
                return grpc.aio.insecure_channel(address, CHANNEL_OPTIONS)
            return grpc.aio.secure_channel(address, credentials, CHANNEL_OPTIONS)

        return cls._connected(open_channel, (target, media, notify), token=token, **settings)

    async def close(self) -> None:
        for channel in self._owned:
            await channel.close(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- calls --------------------------------------------------------------------------

    async def submit(
        self, request: creation.SubmitJobRequest | None = None, /, **fields: Any
    ) -> job_pb2.Job:
        """SubmitJob, with a generated ``request_id`` unless one is given: retried, it is
        the same job."""
        return await self._run(calls.submit(request, fields))

    async def get_job(self, job_id: str) -> job_pb2.Job:
        return await self._run(calls.get_job(job_id))

    async def list_jobs(
        self, request: creation.ListJobsRequest | None = None, /, **fields: Any
    ) -> creation.ListJobsResponse:
        return await self._run(calls.list_jobs(request, fields))

    async def cancel_job(self, job_id: str) -> job_pb2.Job:
        return await self._run(calls.cancel_job(job_id))

    async def get_balance(self) -> creation.GetBalanceResponse:
        return await self._run(calls.get_balance())

    async def list_catalog(
        self, request: creation.ListCatalogRequest | None = None, /, **fields: Any
    ) -> creation.ListCatalogResponse:
        return await self._run(calls.list_catalog(request, fields))

    async def create_upload(
        self, request: media.CreateUploadRequest | None = None, /, **fields: Any
    ) -> media.CreateUploadResponse:
        return await self._run(calls.create_upload(request, fields))

    async def complete_upload(self, asset_id: str) -> asset_pb2.Asset:
        return await self._run(calls.complete_upload(asset_id))

    async def upload(
        self, data: bytes, content_type: str, *, put_timeout: float = 30.0
    ) -> asset_pb2.Asset:
        """An input photo stored and ready: CreateUpload, the bytes PUT to the signed URL
        (in a thread), CompleteUpload."""
        created = await self._run(calls.input_upload(data, content_type))
        await asyncio.to_thread(upload.put, created, data, put_timeout)
        return await self.complete_upload(created.asset.asset_id)

    async def wait(
        self,
        job_id: str,
        timeout: float = DEFAULT_WAIT,  # noqa: ASYNC109 also each stream's deadline
        *,
        on_state: StateHook | None = None,
    ) -> JobState:
        """The job's terminal state (SUCCEEDED, FAILED or CANCELLED), followed over
        WatchJob and reconnecting as :mod:`atelier_client.watch` says; DeadlineExceeded
        after ``timeout`` seconds. ``on_state`` is told of each newer state on the way."""
        watch = self._core.watch(job_id, timeout, on_state)
        while True:
            delay: float | None = None
            try:
                stream = self._notify.WatchJob(
                    watch.request(), metadata=self._core.metadata(), timeout=watch.remaining()
                )
                async for message in stream:
                    delay = watch.take(message)
                    if (final := watch.terminal()) is not None:
                        return final
                    if delay is not None:
                        stream.cancel()
                        break
            except grpc.RpcError as failure:
                delay = watch.failed(failure)
            await self._sleep(watch.pause(delay))

    async def _run(self, call: calls.Call[Out]) -> Out:
        method = getattr(self._stubs[call.service], call.method)
        attempts = self._core.attempts(call.retryable)
        while True:
            try:
                response = await method(
                    call.request, metadata=self._core.metadata(), timeout=attempts.timeout()
                )
            except grpc.RpcError as failure:
                await self._sleep(attempts.delay_after(failure))
            else:
                return call.unwrap(response)

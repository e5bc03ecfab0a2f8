"""The blocking client: atelier's public calls over ``grpc`` channels.

with Client.connect("127.0.0.1:8080", token=token) as atelier:
    job = atelier.submit(model_id="stub-fast", style_id="watercolor", ...)
    final = atelier.wait(job.job_id, timeout=120)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
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


class Client(ClientBase[grpc.Channel]):
    """atelier's public calls; typed errors (:mod:`atelier_client.errors`), retries as
    :mod:`atelier_client.retry` says; channels as :class:`ClientBase` says."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        token: Token,
        media_channel: grpc.Channel | None = None,
        notify_channel: grpc.Channel | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 frozen
        on_retry: RetryHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
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

        def open_channel(address: str) -> grpc.Channel:
            if credentials is None:
                return grpc.insecure_channel(address, CHANNEL_OPTIONS)
            return grpc.secure_channel(address, credentials, CHANNEL_OPTIONS)

        return cls._connected(open_channel, (target, media, notify), token=token, **settings)

    def close(self) -> None:
        for channel in self._owned:
            channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- calls --------------------------------------------------------------------------

    def submit(
        self, request: creation.SubmitJobRequest | None = None, /, **fields: Any
    ) -> job_pb2.Job:
        """SubmitJob, with a generated ``request_id`` unless one is given: retried, it is
        the same job."""
        return self._run(calls.submit(request, fields))

    def get_job(self, job_id: str) -> job_pb2.Job:
        return self._run(calls.get_job(job_id))

    def list_jobs(
        self, request: creation.ListJobsRequest | None = None, /, **fields: Any
    ) -> creation.ListJobsResponse:
        return self._run(calls.list_jobs(request, fields))

    def cancel_job(self, job_id: str) -> job_pb2.Job:
        return self._run(calls.cancel_job(job_id))

    def get_balance(self) -> creation.GetBalanceResponse:
        return self._run(calls.get_balance())

    def list_catalog(
        self, request: creation.ListCatalogRequest | None = None, /, **fields: Any
    ) -> creation.ListCatalogResponse:
        return self._run(calls.list_catalog(request, fields))

    def create_upload(
        self, request: media.CreateUploadRequest | None = None, /, **fields: Any
    ) -> media.CreateUploadResponse:
        return self._run(calls.create_upload(request, fields))

    def complete_upload(self, asset_id: str) -> asset_pb2.Asset:
        return self._run(calls.complete_upload(asset_id))

    def upload(
        self, data: bytes, content_type: str, *, put_timeout: float = 30.0
    ) -> asset_pb2.Asset:
        """An input photo stored and ready: CreateUpload, the bytes PUT to the signed URL,
        CompleteUpload."""
        created = self._run(calls.input_upload(data, content_type))
        upload.put(created, data, put_timeout)
        return self.complete_upload(created.asset.asset_id)

    def wait(
        self,
        job_id: str,
        timeout: float = DEFAULT_WAIT,
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
                for message in stream:
                    delay = watch.take(message)
                    if (final := watch.terminal()) is not None:
                        return final
                    if delay is not None:
                        stream.cancel()
                        break
            except grpc.RpcError as failure:
                delay = watch.failed(failure)
            self._sleep(watch.pause(delay))

    def _run(self, call: calls.Call[Out]) -> Out:
        method = getattr(self._stubs[call.service], call.method)
        attempts = self._core.attempts(call.retryable)
        while True:
            try:
                response = method(
                    call.request, metadata=self._core.metadata(), timeout=attempts.timeout()
                )
            except grpc.RpcError as failure:
                self._sleep(attempts.delay_after(failure))
            else:
                return call.unwrap(response)

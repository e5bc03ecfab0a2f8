"""The blocking client: atelier's public calls over ``grpc`` channels.

with Client.connect("127.0.0.1:8080", token=token) as atelier:
    job = atelier.submit(model_id="stub-fast", style_id="watercolor", ...)
    final = atelier.wait(job.job_id, timeout=120)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self

import grpc

from atelier.creation.v1 import creation_service_pb2 as creation
from atelier.creation.v1 import job_pb2
from atelier.media.v1 import asset_pb2
from atelier.media.v1 import media_service_pb2 as media
from atelier.notify.v1 import notify_service_pb2 as notify
from atelier_client import calls, upload
from atelier_client.auth import Token
from atelier_client.calls import Out
from atelier_client.core import CHANNEL_OPTIONS, DEFAULT_WAIT, ClientBase, Core
from atelier_client.retry import RetryHook, RetryPolicy
from atelier_client.watch import Job, StateHook


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

    def wait_job(self, job_id: str, timeout: float = 30.0) -> job_pb2.Job:
        """WaitJob: one call that answers once the job settled (SUCCEEDED, FAILED,
        CANCELLED or NEEDS_ATTENTION) or after ``timeout`` seconds (at most 60) with the
        job as it is then: check its status. No stream is read."""
        return self._run(calls.wait_job(job_id, timeout))

    def list_jobs(
        self, request: creation.ListJobsRequest | None = None, /, **fields: Any
    ) -> creation.ListJobsResponse:
        return self._run(calls.list_jobs(request, fields))

    def cancel_job(self, job_id: str) -> job_pb2.Job:
        """CancelJob: the job CANCELLED, or RUNNING with ``cancel_requested`` set.
        Retried: a repeated cancel answers the job as it is."""
        return self._run(calls.cancel_job(job_id))

    def delete_job(self, job_id: str, *, keep_assets: bool = False) -> None:
        """DeleteJob of a finished job, its photos too unless ``keep_assets``. Retried:
        deleting a deleted job succeeds again."""
        self._run(calls.delete_job(job_id, keep_assets))

    def list_ledger_entries(
        self, request: creation.ListLedgerEntriesRequest | None = None, /, **fields: Any
    ) -> creation.ListLedgerEntriesResponse:
        return self._run(calls.list_ledger_entries(request, fields))

    def get_balance(self) -> creation.GetBalanceResponse:
        return self._run(calls.get_balance())

    def list_catalog(
        self, request: creation.ListCatalogRequest | None = None, /, **fields: Any
    ) -> creation.ListCatalogResponse:
        return self._run(calls.list_catalog(request, fields))

    def register_device(
        self, request: notify.RegisterDeviceRequest | None = None, /, **fields: Any
    ) -> notify.Device:
        """RegisterDevice (the same device when the token was registered before)."""
        return self._run(calls.register_device(request, fields))

    def list_devices(
        self, request: notify.ListDevicesRequest | None = None, /, **fields: Any
    ) -> notify.ListDevicesResponse:
        return self._run(calls.list_devices(request, fields))

    def delete_device(self, device_id: str) -> None:
        """DeleteDevice; a NOT_FOUND after a retry is the device gone (the first attempt
        landed): only a first attempt's NOT_FOUND is raised."""
        self._run(calls.delete_device(device_id))

    def register_live_activity(
        self, request: notify.RegisterLiveActivityRequest | None = None, /, **fields: Any
    ) -> notify.RegisterLiveActivityResponse:
        return self._run(calls.register_live_activity(request, fields))

    def delete_live_activity(self, job_id: str, activity_id: str) -> None:
        """DeleteLiveActivity; gone after a retry is done, as for delete_device."""
        self._run(calls.delete_live_activity(job_id, activity_id))

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
    ) -> Job:
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

    def watch_jobs(self, cursor: str = "") -> Iterator[notify.WatchJobsResponse]:
        """The caller's jobs as they change, over WatchJobs, for as long as the caller
        reads: each ``job`` message (a newer state; drop a job with ``deleted`` set) and
        each ``snapshot_end``, both carrying the ``cursor`` to resume from. It reconnects
        as :mod:`atelier_client.watch` says, from the last cursor; pass a saved cursor to
        resume a watch of an earlier run (FailedPrecondition CURSOR_EXPIRED when it is too
        old: start without one). Closing the iterator closes the stream."""
        watch = self._core.watch_jobs(cursor)
        while True:
            delay: float | None = None
            stream = None
            try:
                stream = self._notify.WatchJobs(watch.request(), metadata=self._core.metadata())
                for message in stream:
                    news, delay = watch.take(message)
                    if news:
                        yield message
                    if delay is not None:
                        break
            except grpc.RpcError as failure:
                delay = watch.failed(failure)
            finally:
                if stream is not None:
                    stream.cancel()
            self._sleep(watch.pause(delay))

    def _run(self, call: calls.Call[Out]) -> Out:
        method = getattr(self._stubs[call.service], call.method)
        attempts = self._core.attempts(call.retryable)
        while True:
            try:
                response = method(
                    call.request,
                    metadata=self._core.metadata(),
                    timeout=attempts.timeout() + call.holds,
                )
            except grpc.RpcError as failure:
                if call.gone_when_missing and attempts.found_gone(failure):
                    return call.unwrap(None)
                self._sleep(attempts.delay_after(failure))
            else:
                return call.unwrap(response)

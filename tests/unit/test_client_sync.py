"""The blocking client against grpc_testing's channel: no network, no server. The test
plays the server: it takes each call the client makes and answers it (a response, or a
status with google.rpc details in ``grpc-status-details-bin``). Time is fake: the client's
sleeps advance its clock and are recorded."""

from __future__ import annotations

import ast
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import grpc_testing
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

import atelier_client
from atelier.creation.v1 import creation_service_pb2, job_pb2
from atelier.media.v1 import media_service_pb2
from atelier.notify.v1 import notify_service_pb2
from atelier_client import (
    AtelierError,
    Client,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
    calls,
)
from atelier_client.errors import FieldViolation, from_status

CREATION = creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"]
MEDIA = media_service_pb2.DESCRIPTOR.services_by_name["MediaService"]
NOTIFY = notify_service_pb2.DESCRIPTOR.services_by_name["NotifyService"]
SUBMIT = CREATION.methods_by_name["SubmitJob"]
GET_JOB = CREATION.methods_by_name["GetJob"]
CANCEL = CREATION.methods_by_name["CancelJob"]
WAIT_JOB = CREATION.methods_by_name["WaitJob"]
COMPLETE_UPLOAD = MEDIA.methods_by_name["CompleteUpload"]
WATCH = NOTIFY.methods_by_name["WatchJob"]
WATCH_JOBS = NOTIFY.methods_by_name["WatchJobs"]
DELETE_JOB = CREATION.methods_by_name["DeleteJob"]
DELETE_DEVICE = NOTIFY.methods_by_name["DeleteDevice"]
# Long enough for a loaded machine; a client that never makes the call fails the test.
TAKE_WITHIN = 10.0


def details(
    reason: str = "",
    retry_after: int | None = None,
    violations: tuple[tuple[str, str], ...] = (),
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
    metadata: dict[str, str] | None = None,
) -> bytes:
    """A serialized google.rpc.Status as atelier's services send it."""
    packed: list[Message] = []
    if reason:
        info = error_details_pb2.ErrorInfo(reason=reason, domain="atelier.dev")
        info.metadata.update(metadata or {})
        packed.append(info)
    if violations:
        packed.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                    for f, d in violations
                ]
            )
        )
    if retry_after is not None:
        packed.append(
            error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after))
        )
    status = status_pb2.Status(code=code.value[0], message="said the server")
    for detail in packed:
        wrapper = any_pb2.Any()
        wrapper.Pack(detail)
        status.details.append(wrapper)
    return status.SerializeToString()


def trailers(status_details: bytes) -> tuple[tuple[str, bytes], ...]:
    return (("grpc-status-details-bin", status_details),)


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Server:
    """The test's side of the channel: runs a client call in a thread and takes the RPCs
    it makes, failing (instead of hanging) when the client makes none."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._pool = ThreadPoolExecutor(1)
        self.running: Future[Any] | None = None

    def run(self, call: Callable[[], Any]) -> None:
        self.running = self._pool.submit(call)

    def take(self, method: Any, kind: str = "unary_unary") -> tuple[dict[str, str], Any, Any]:
        taker = getattr(self.channel, f"take_{kind}")
        metadata, request, rpc = self._within(lambda: taker(method), f"call {method.name}")
        return dict(metadata), request, rpc

    def cancelled(self, rpc: Any) -> None:
        """Returns once the client cancelled ``rpc`` (it read what was sent, and left)."""
        self._within(rpc.cancelled, "cancel the stream")

    def _within(self, wait: Callable[[], Any], what: str) -> Any:
        done: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=lambda: done.put(wait()), daemon=True).start()
        try:
            return done.get(timeout=TAKE_WITHIN)
        except queue.Empty:
            assert self.running is not None
            if self.running.done():
                self.running.result()  # the client's own exception
            raise AssertionError(f"the client did not {what}") from None

    def result(self) -> Any:
        assert self.running is not None
        return self.running.result(timeout=TAKE_WITHIN)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def time_() -> FakeTime:
    return FakeTime()


@pytest.fixture
def server() -> Iterator[Server]:
    channel = grpc_testing.channel([CREATION, MEDIA, NOTIFY], grpc_testing.strict_real_time())
    fake = Server(channel)
    yield fake
    fake.close()


@pytest.fixture
def client(server: Server, time_: FakeTime) -> Client:
    return Client(
        server.channel,
        token="t0ken",
        retry=RetryPolicy(max_attempts=4, deadline=60.0),
        clock=time_.clock,
        sleep=time_.sleep,
    )


def job(version: int = 1) -> job_pb2.Job:
    return job_pb2.Job(job_id="j-1", version=version, status=job_pb2.JOB_STATUS_QUEUED)


def submit_fields() -> dict[str, Any]:
    return {"model_id": "stub-fast", "style_id": "watercolor", "width": 512, "height": 512}


def test_submit_retries_with_the_same_request_id_after_the_retry_info_delay(
    server: Server, client: Client, time_: FakeTime
) -> None:
    retried: list[tuple[str, float]] = []
    client = Client(
        server.channel,
        token="t0ken",
        retry=RetryPolicy(max_attempts=4, deadline=60.0, initial_backoff=0.2),
        clock=time_.clock,
        sleep=time_.sleep,
        on_retry=lambda error, delay: retried.append((error.reason, delay)),
    )
    server.run(lambda: client.submit(**submit_fields()))
    metadata, first, rpc = server.take(SUBMIT)
    busy = details("USER_BUSY", retry_after=3, code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    rpc.terminate(None, trailers(busy), grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    _, second, rpc = server.take(SUBMIT)
    rpc.terminate(None, (), grpc.StatusCode.UNAVAILABLE, "connection reset")  # no RetryInfo
    _, third, rpc = server.take(SUBMIT)
    rpc.terminate(creation_service_pb2.SubmitJobResponse(job=job()), (), grpc.StatusCode.OK, "")

    assert server.result() == job()
    assert metadata["authorization"] == "Bearer t0ken"
    assert uuid.UUID(first.request_id).version == 4
    assert first == second == third  # one request_id: a retried submit is the same job
    assert time_.sleeps[0] == 3.0  # the server's RetryInfo, as said
    assert 0.2 <= time_.sleeps[1] <= 0.4  # after attempt 2, jittered: no RetryInfo
    assert retried == [("USER_BUSY", 3.0), ("", time_.sleeps[1])]


def test_a_request_id_given_is_sent_and_a_request_message_passes_through(
    server: Server, client: Client
) -> None:
    request = creation_service_pb2.SubmitJobRequest(request_id="mine", **submit_fields())
    server.run(lambda: client.submit(request))
    _, sent, rpc = server.take(SUBMIT)
    rpc.terminate(creation_service_pb2.SubmitJobResponse(job=job()), (), grpc.StatusCode.OK, "")
    server.result()
    assert sent == request


def test_wait_job_sends_its_timeout_and_allows_the_call_that_long_beyond_the_attempts(
    server: Server, client: Client
) -> None:
    server.run(lambda: client.wait_job("j-1", 20))
    _, sent, rpc = server.take(WAIT_JOB)
    assert sent == creation_service_pb2.WaitJobRequest(
        job_id="j-1", timeout=duration_pb2.Duration(seconds=20)
    )
    # Each attempt's gRPC deadline is its own 10 s on top of the 20 s the server holds it.
    assert calls.wait_job("j-1", 20).holds == 20
    rpc.terminate(creation_service_pb2.WaitJobResponse(job=job(3)), (), grpc.StatusCode.OK, "")
    assert server.result() == job(3)
    with pytest.raises(ValueError, match="0 to 60"):
        client.wait_job("j-1", 61)


def test_retries_stop_after_max_attempts_with_the_typed_error(
    server: Server, client: Client, time_: FakeTime
) -> None:
    server.run(lambda: client.get_job("j-1"))
    for _ in range(4):
        _, _, rpc = server.take(GET_JOB)
        down = details("DATABASE_UNAVAILABLE", retry_after=1, code=grpc.StatusCode.UNAVAILABLE)
        rpc.terminate(None, trailers(down), grpc.StatusCode.UNAVAILABLE, "db down")
    with pytest.raises(Unavailable) as raised:
        server.result()
    assert raised.value.reason == "DATABASE_UNAVAILABLE"
    assert raised.value.retry_after == 1.0
    assert time_.sleeps == [1.0, 1.0, 1.0]  # four attempts, three sleeps


def test_a_retry_info_delay_past_the_deadline_fails_at_once(
    server: Server, client: Client, time_: FakeTime
) -> None:
    server.run(lambda: client.submit(**submit_fields()))
    _, _, rpc = server.take(SUBMIT)
    quota = details(
        "DAILY_QUOTA_EXCEEDED", retry_after=7200, code=grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    rpc.terminate(None, trailers(quota), grpc.StatusCode.RESOURCE_EXHAUSTED, "quota")
    with pytest.raises(ResourceExhausted) as raised:
        server.result()
    assert (raised.value.reason, raised.value.retry_after) == ("DAILY_QUOTA_EXCEEDED", 7200.0)
    assert time_.sleeps == []


def test_an_aborted_conflict_is_retried_and_already_exists_is_not(
    server: Server, client: Client, time_: FakeTime
) -> None:
    server.run(lambda: client.submit(**submit_fields()))
    _, first, rpc = server.take(SUBMIT)
    busy = details("USER_BUSY", retry_after=0, code=grpc.StatusCode.ABORTED)
    rpc.terminate(None, trailers(busy), grpc.StatusCode.ABORTED, "busy")
    _, second, rpc = server.take(SUBMIT)
    reused = details("IDEMPOTENCY_KEY_REUSED", code=grpc.StatusCode.ALREADY_EXISTS)
    rpc.terminate(None, trailers(reused), grpc.StatusCode.ALREADY_EXISTS, "key reused")
    with pytest.raises(AtelierError) as raised:
        server.result()
    assert raised.value.reason == "IDEMPOTENCY_KEY_REUSED"
    assert first == second
    assert time_.sleeps == [0.0]  # the RetryInfo's 0 s: at once


def test_complete_upload_carries_no_key_and_is_never_retried(
    server: Server, client: Client, time_: FakeTime
) -> None:
    # A replay of a completion that landed is refused (UPLOAD_ALREADY_COMPLETED).
    server.run(lambda: client.complete_upload("a-1"))
    _, _, rpc = server.take(COMPLETE_UPLOAD)
    rpc.terminate(None, (), grpc.StatusCode.UNAVAILABLE, "reset")
    with pytest.raises(Unavailable):
        server.result()
    assert time_.sleeps == []


def test_a_cancel_is_retried_and_the_replay_answers_the_job(
    server: Server, client: Client, time_: FakeTime
) -> None:
    """The server answers a repeated cancel with the job as it is, so a cancel whose
    answer was lost is tried again."""
    server.run(lambda: client.cancel_job("j-1"))
    _, first, rpc = server.take(CANCEL)
    rpc.terminate(None, (), grpc.StatusCode.UNAVAILABLE, "reset")
    _, second, rpc = server.take(CANCEL)
    cancelled = job_pb2.Job(job_id="j-1", version=2, status=job_pb2.JOB_STATUS_CANCELLED)
    rpc.terminate(creation_service_pb2.CancelJobResponse(job=cancelled), (), grpc.StatusCode.OK, "")
    assert server.result() == cancelled
    assert first == second == creation_service_pb2.CancelJobRequest(job_id="j-1")
    assert len(time_.sleeps) == 1


def test_delete_job_deletes_photos_unless_kept_and_is_retried(
    server: Server, client: Client
) -> None:
    server.run(lambda: client.delete_job("j-1"))
    _, first, rpc = server.take(DELETE_JOB)
    rpc.terminate(None, (), grpc.StatusCode.UNAVAILABLE, "reset")
    _, second, rpc = server.take(DELETE_JOB)
    rpc.terminate(creation_service_pb2.DeleteJobResponse(), (), grpc.StatusCode.OK, "")
    assert server.result() is None
    assert first == second == creation_service_pb2.DeleteJobRequest(job_id="j-1")

    server.run(lambda: client.delete_job("j-2", keep_assets=True))
    _, kept, rpc = server.take(DELETE_JOB)
    rpc.terminate(creation_service_pb2.DeleteJobResponse(), (), grpc.StatusCode.OK, "")
    server.result()
    assert kept == creation_service_pb2.DeleteJobRequest(job_id="j-2", keep_assets=True)


def test_a_device_missing_after_a_retry_is_deleted_but_missing_at_first_is_not_found(
    server: Server, client: Client
) -> None:
    missing = trailers(details("DEVICE_NOT_FOUND", code=grpc.StatusCode.NOT_FOUND))
    server.run(lambda: client.delete_device("d-1"))
    _, _, rpc = server.take(DELETE_DEVICE)
    rpc.terminate(None, (), grpc.StatusCode.UNAVAILABLE, "reset")  # it may have landed
    _, _, rpc = server.take(DELETE_DEVICE)
    rpc.terminate(None, missing, grpc.StatusCode.NOT_FOUND, "no such device")
    assert server.result() is None

    server.run(lambda: client.delete_device("d-2"))
    _, _, rpc = server.take(DELETE_DEVICE)
    rpc.terminate(None, missing, grpc.StatusCode.NOT_FOUND, "no such device")
    with pytest.raises(NotFound) as raised:
        server.result()
    assert raised.value.reason == "DEVICE_NOT_FOUND"


def test_errors_are_typed_with_reason_violations_and_metadata(
    server: Server, client: Client
) -> None:
    server.run(lambda: client.submit(**submit_fields()))
    _, _, rpc = server.take(SUBMIT)
    bad = details(
        "MODEL_NOT_AVAILABLE",
        violations=(("model_id", "no such model"),),
        code=grpc.StatusCode.INVALID_ARGUMENT,
        metadata={"model_id": "x"},
    )
    rpc.terminate(None, trailers(bad), grpc.StatusCode.INVALID_ARGUMENT, "model_id: no such")
    with pytest.raises(InvalidArgument) as raised:
        server.result()
    error = raised.value
    assert (error.code, error.reason, error.domain) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MODEL_NOT_AVAILABLE",
        "atelier.dev",
    )
    assert error.metadata == {"model_id": "x"}
    assert error.field_violations == (FieldViolation("model_id", "no such model"),)
    assert error.message == "model_id: no such"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
        (grpc.StatusCode.FAILED_PRECONDITION, FailedPrecondition),
        (grpc.StatusCode.DATA_LOSS, AtelierError),
    ],
)
def test_each_code_has_its_class(code: grpc.StatusCode, kind: type[AtelierError]) -> None:
    error = from_status(code, "m", details("SOME_REASON", code=code))
    assert type(error) is kind and error.code is code and error.reason == "SOME_REASON"


def test_malformed_details_keep_the_code() -> None:
    error = from_status(grpc.StatusCode.NOT_FOUND, "m", b"\xff\xff not a status")
    assert type(error) is NotFound and error.reason == ""


def test_a_token_callable_is_asked_before_each_call_and_with_token_calls_as_another(
    server: Server,
) -> None:
    tokens = iter(["first", "second"])
    client = Client(server.channel, token=lambda: next(tokens))
    callers = [client, client, client.with_token("other-user")]
    seen = []
    for caller in callers:
        server.run(lambda caller=caller: caller.get_job("j-1"))
        metadata, _, rpc = server.take(GET_JOB)
        rpc.terminate(creation_service_pb2.GetJobResponse(job=job()), (), grpc.StatusCode.OK, "")
        server.result()
        seen.append(metadata["authorization"])
    assert seen == ["Bearer first", "Bearer second", "Bearer other-user"]


def state(version: int, status: int, done: bool = False) -> notify_service_pb2.WatchJobResponse:
    return notify_service_pb2.WatchJobResponse(
        job=job_pb2.Job(job_id="j-1", version=version, status=status, done=done)
    )


def test_wait_reconnects_from_the_last_version_until_the_terminal_state(
    server: Server, client: Client, time_: FakeTime
) -> None:
    server.run(lambda: client.wait("j-1", timeout=60))
    asked = []

    _, request, rpc = server.take(WATCH, "unary_stream")
    asked.append(request.after_version)
    rpc.send_response(state(1, job_pb2.JOB_STATUS_QUEUED))
    rpc.send_response(state(3, job_pb2.JOB_STATUS_RUNNING))
    draining = notify_service_pb2.StreamEnd(
        reason=notify_service_pb2.STREAM_END_REASON_DRAINING,
        retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000),
    )
    rpc.send_response(notify_service_pb2.WatchJobResponse(end=draining))
    server.cancelled(rpc)

    _, request, rpc = server.take(WATCH, "unary_stream")
    asked.append(request.after_version)
    rpc.send_response(notify_service_pb2.WatchJobResponse(keep_alive={}))
    failure = status_pb2.Status()
    failure.ParseFromString(
        details("PROJECTION_UNAVAILABLE", retry_after=2, code=grpc.StatusCode.UNAVAILABLE)
    )
    rpc.send_response(notify_service_pb2.WatchJobResponse(error=failure))
    server.cancelled(rpc)

    _, request, rpc = server.take(WATCH, "unary_stream")
    asked.append(request.after_version)
    # The server process died: the stream is reset, with no status details.
    rpc.terminate((), grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2")

    _, request, rpc = server.take(WATCH, "unary_stream")
    asked.append(request.after_version)
    rpc.send_response(state(2, job_pb2.JOB_STATUS_QUEUED))  # older than seen: ignored
    rpc.send_response(state(5, job_pb2.JOB_STATUS_SUCCEEDED, done=True))
    rpc.terminate((), grpc.StatusCode.OK, "")

    final = server.result()
    assert (final.version, final.status, final.done) == (5, job_pb2.JOB_STATUS_SUCCEEDED, True)
    assert asked == [0, 3, 3, 3]
    # The end's retry_delay, the error's RetryInfo, then a backoff after the reset.
    assert time_.sleeps[:2] == [1.5, 2.0]
    assert 0.1 <= time_.sleeps[2] <= 0.2  # after the second failure in a row


def test_wait_raises_a_final_stream_error(server: Server, client: Client) -> None:
    server.run(lambda: client.wait("someone-elses", timeout=60))
    _, _, rpc = server.take(WATCH, "unary_stream")
    missing = details("JOB_NOT_FOUND", code=grpc.StatusCode.NOT_FOUND)
    rpc.terminate(trailers(missing), grpc.StatusCode.NOT_FOUND, "job not found")
    with pytest.raises(NotFound) as raised:
        server.result()
    assert raised.value.reason == "JOB_NOT_FOUND"


def test_wait_gives_up_after_its_timeout(server: Server, client: Client, time_: FakeTime) -> None:
    server.run(lambda: client.wait("j-1", timeout=5))
    for _ in range(2):
        _, _, rpc = server.take(WATCH, "unary_stream")
        down = details("NOTIFY_BUSY", retry_after=3, code=grpc.StatusCode.UNAVAILABLE)
        rpc.terminate(trailers(down), grpc.StatusCode.UNAVAILABLE, "busy")
    with pytest.raises(DeadlineExceeded) as raised:
        server.result()
    assert isinstance(raised.value, TimeoutError)
    assert time_.sleeps == [3.0, 2.0]  # the second sleep cut to the time left


def test_the_client_imports_only_gen_grpc_and_the_standard_library() -> None:
    """It is what an outside service would use: never the services' own code."""
    package = Path(atelier_client.__file__).parent
    allowed = {"grpc", "google", "atelier", "atelier_client", "__future__"}
    foreign = set()
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in allowed and top not in sys.stdlib_module_names:
                    foreign.add(f"{module.name}: {name}")
    assert foreign == set()


def jobs_message(version: int, cursor: str) -> notify_service_pb2.WatchJobsResponse:
    return notify_service_pb2.WatchJobsResponse(
        job=job_pb2.Job(job_id="j-1", version=version), cursor=cursor
    )


def test_watch_jobs_resumes_from_the_last_cursor_across_ends_and_failures(
    server: Server, client: Client, time_: FakeTime
) -> None:
    got: queue.Queue[notify_service_pb2.WatchJobsResponse] = queue.Queue()
    watching = client.watch_jobs("saved")

    def read() -> None:
        for message in watching:
            got.put(message)

    server.run(read)
    asked = []
    _, request, rpc = server.take(WATCH_JOBS, "unary_stream")
    asked.append(request.cursor)
    rpc.send_response(jobs_message(1, "c1"))
    rpc.send_response(notify_service_pb2.WatchJobsResponse(snapshot_end={}, cursor="c2"))
    rpc.send_response(notify_service_pb2.WatchJobsResponse(keep_alive={}))  # not handed on
    rpc.send_response(jobs_message(2, "c3"))
    end = notify_service_pb2.StreamEnd(
        reason=notify_service_pb2.STREAM_END_REASON_MAX_DURATION,
        retry_delay=duration_pb2.Duration(seconds=2),
    )
    rpc.send_response(notify_service_pb2.WatchJobsResponse(end=end))
    server.cancelled(rpc)

    _, request, rpc = server.take(WATCH_JOBS, "unary_stream")
    asked.append(request.cursor)
    rpc.send_response(jobs_message(3, "c4"))
    handed = [got.get(timeout=TAKE_WITHIN) for _ in range(4)]  # read before the reset
    rpc.terminate((), grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2")

    _, request, rpc = server.take(WATCH_JOBS, "unary_stream")
    asked.append(request.cursor)
    expired = details("CURSOR_EXPIRED", code=grpc.StatusCode.FAILED_PRECONDITION)
    rpc.terminate(trailers(expired), grpc.StatusCode.FAILED_PRECONDITION, "cursor expired")

    with pytest.raises(FailedPrecondition) as raised:
        server.result()
    assert raised.value.reason == "CURSOR_EXPIRED"
    assert asked == ["saved", "c3", "c4"]
    assert got.empty()
    assert [(m.WhichOneof("event"), m.cursor) for m in handed] == [
        ("job", "c1"),
        ("snapshot_end", "c2"),
        ("job", "c3"),
        ("job", "c4"),
    ]
    assert time_.sleeps[0] == 2.0  # the end's retry_delay
    assert 0.05 <= time_.sleeps[1] <= 0.1  # a backoff after the reset


def test_closing_watch_jobs_closes_its_stream(server: Server, client: Client) -> None:
    watching = client.watch_jobs()
    server.run(lambda: next(watching))
    _, request, rpc = server.take(WATCH_JOBS, "unary_stream")
    assert request.cursor == ""
    rpc.send_response(jobs_message(1, "c1"))
    assert server.result().cursor == "c1"
    server.run(watching.close)
    server.cancelled(rpc)
    server.result()

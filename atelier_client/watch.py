"""Following one job over notify's WatchJob until its terminal state (:class:`JobWatch`),
and all of a user's jobs over WatchJobs, resumed from its cursor (:class:`JobsWatch`),
across reconnects.

What ends a stream early, and what ``wait`` does then:
- a ``StreamEnd`` (the server draining for a restart, the stream's maximum duration, a
  slow reader): reconnect after its ``retry_delay``;
- an ``error`` message or a failed stream: reconnect when the failure is transient
  (UNAVAILABLE, RESOURCE_EXHAUSTED, or an INTERNAL / CANCELLED that carries no ErrorInfo,
  which is what a server that died mid-stream leaves: an RST_STREAM), after its RetryInfo
  delay or a backoff; any other failure is raised;
- a stream closed with OK before the terminal state (which the server does not do):
  reconnect after a backoff.
The whole wait, reconnects included, is bounded by its timeout (DeadlineExceeded).
Each reconnect asks for versions after the last one seen, so nothing is read twice and a
state missed while disconnected arrives first. Both flavours of the client share this.

WatchJobs reconnects on the same events, asking for changes after the last cursor it was
handed (each job and snapshot-end message carries one): the new stream's snapshot holds
the caller's unfinished jobs and every job changed since, then a new snapshot end. It has
no deadline of its own; a cursor the server can no longer resume from is FAILED_PRECONDITION
``CURSOR_EXPIRED`` (raised: start afresh with no cursor and list the jobs).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import grpc

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2
from atelier_client import errors
from atelier_client.retry import RetryPolicy

# The job as every read and stream carries it (creation's Job).
Job = job_pb2.Job
# Told of each newer version a wait sees (progress for a log line, say).
StateHook = Callable[[Job], None]

_RECONNECT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# Codes that a transport failure (not atelier) produces; with an ErrorInfo they are real.
_TRANSPORT_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED})


def reconnectable(error: errors.AtelierError) -> bool:
    return error.code in _RECONNECT_CODES or (error.code in _TRANSPORT_CODES and not error.reason)


class JobWatch:
    """What one ``wait`` has seen (the newest state), how long it has left, and how to go
    on after each event."""

    def __init__(
        self,
        job_id: str,
        timeout: float,
        policy: RetryPolicy,
        clock: Callable[[], float],
        rng: random.Random,
        on_state: StateHook | None = None,
    ) -> None:
        self.job_id = job_id
        self._on_state = on_state
        self.state: Job | None = None
        self._timeout = timeout
        self._ends = clock() + timeout
        self._policy = policy
        self._clock = clock
        self._rng = rng
        self._failures = 0

    @property
    def last_version(self) -> int:
        return self.state.version if self.state is not None else 0

    def terminal(self) -> Job | None:
        """The terminal state, once seen."""
        return self.state if self.state is not None and self.state.done else None

    def request(self) -> notify_service_pb2.WatchJobRequest:
        return notify_service_pb2.WatchJobRequest(
            job_id=self.job_id, after_version=self.last_version
        )

    def remaining(self) -> float:
        """Seconds left (the next stream's deadline); raises once there are none."""
        left = self._ends - self._clock()
        if left <= 0:
            raise self._timed_out()
        return left

    def take(self, message: notify_service_pb2.WatchJobResponse) -> float | None:
        """Reads one message. Returns a delay when the stream is ending and the wait goes
        on with a new stream after it; raises the error of a failure that is final."""
        event = message.WhichOneof("event")
        if event == "job":
            if message.job.version > self.last_version:
                self.state = message.job
                if self._on_state is not None:
                    self._on_state(message.job)
            self._failures = 0
            return None
        if event == "end":
            delay = message.end.retry_delay
            return delay.seconds + delay.nanos / 1e9
        if event == "error":
            return self._after(errors.from_status_message(message.error))
        return None  # keep-alive (or an event this client does not know yet)

    def failed(self, failure: grpc.RpcError) -> float:
        """The delay before reconnecting after a failed stream; raises the typed error
        when the failure is final (our own deadline passing is the wait's timeout)."""
        error = errors.from_rpc_error(failure)
        if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            raise self._timed_out() from failure
        return self._after(error)

    def pause(self, delay: float | None) -> float:
        """How long to sleep before the next stream: ``delay``, or a backoff when the
        stream closed without saying why; never past the timeout."""
        if delay is None:
            self._failures += 1
            delay = self._policy.backoff(self._failures, self._rng)
        return max(0.0, min(delay, self._ends - self._clock()))

    def _after(self, error: errors.AtelierError) -> float:
        if not reconnectable(error):
            raise error
        self._failures += 1
        if error.retry_after is not None:
            return error.retry_after
        return self._policy.backoff(self._failures, self._rng)

    def _timed_out(self) -> errors.DeadlineExceeded:
        seen = "nothing" if self.state is None else f"version {self.last_version}"
        return errors.DeadlineExceeded(
            f"job {self.job_id} did not finish within {self._timeout:g} s ({seen} seen)"
        )


# The WatchJobs messages a caller is handed: a job's newer state, or the snapshot's end.
_NEWS = frozenset({"job", "snapshot_end"})


class JobsWatch:
    """What one ``watch_jobs`` has been handed (the last cursor) and how to go on after
    each event; it never ends by itself."""

    def __init__(self, cursor: str, policy: RetryPolicy, rng: random.Random) -> None:
        self.cursor = cursor
        self._policy = policy
        self._rng = rng
        self._failures = 0

    def request(self) -> notify_service_pb2.WatchJobsRequest:
        return notify_service_pb2.WatchJobsRequest(cursor=self.cursor)

    def take(self, message: notify_service_pb2.WatchJobsResponse) -> tuple[bool, float | None]:
        """Reads one message: whether the caller is handed it (a job, the snapshot's
        end), and a delay when the stream is ending and a new one follows after it;
        raises the error of a failure that is final."""
        event = message.WhichOneof("event")
        if event in _NEWS:
            if message.cursor:
                self.cursor = message.cursor
            self._failures = 0
            return True, None
        if event == "end":
            delay = message.end.retry_delay
            return False, delay.seconds + delay.nanos / 1e9
        if event == "error":
            return False, self._after(errors.from_status_message(message.error))
        return False, None  # keep-alive (or an event this client does not know yet)

    def failed(self, failure: grpc.RpcError) -> float:
        """The delay before reconnecting after a failed stream; raises the typed error
        when the failure is final (CURSOR_EXPIRED among them)."""
        return self._after(errors.from_rpc_error(failure))

    def pause(self, delay: float | None) -> float:
        """How long to sleep before the next stream: ``delay``, or a backoff when the
        stream closed without saying why."""
        if delay is None:
            self._failures += 1
            delay = self._policy.backoff(self._failures, self._rng)
        return max(0.0, delay)

    def _after(self, error: errors.AtelierError) -> float:
        if not reconnectable(error):
            raise error
        self._failures += 1
        if error.retry_after is not None:
            return error.retry_after
        return self._policy.backoff(self._failures, self._rng)

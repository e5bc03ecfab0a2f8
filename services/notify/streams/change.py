"""One applied job state as the streams see it, and a WatchJobs snapshot of them."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2

_TERMINAL = frozenset(
    {job_pb2.JOB_STATUS_SUCCEEDED, job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELLED}
)

# The Redis payload: seq and terminal flag, then the serialized Job.
_HEADER = struct.Struct(">qB")


@dataclass(frozen=True, slots=True)
class Change:
    """A job's state at one version, with the projection's per-user cursor (``seq``).
    ``state`` is shared by every stream that sends it: never mutate it."""

    job_id: str
    user_id: str
    version: int
    seq: int
    terminal: bool
    state: job_pb2.Job
    # The WatchJob and WatchJobs messages for this state, serialized once however many
    # streams send them (a broadcast reaches thousands of streams).
    _serialized: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    @property
    def queued(self) -> bool:
        return self.state.status == job_pb2.JOB_STATUS_QUEUED

    def job_response(self) -> bytes:
        """``WatchJobResponse(job=state)``, serialized."""
        cached = self._serialized.get("job")
        if cached is None:
            response = notify_service_pb2.WatchJobResponse(job=self.state)
            cached = self._serialized["job"] = response.SerializeToString()
        return cached

    def jobs_response(self, cursor: str) -> bytes:
        """``WatchJobsResponse(job=state, cursor=cursor)``, serialized: the state's part is
        serialized once, the stream's own cursor appended (protobuf reads concatenated
        messages as one, and the two parts set different fields)."""
        cached = self._serialized.get("jobs")
        if cached is None:
            response = notify_service_pb2.WatchJobsResponse(job=self.state)
            cached = self._serialized["jobs"] = response.SerializeToString()
        return cached + notify_service_pb2.WatchJobsResponse(cursor=cursor).SerializeToString()

    def to_bytes(self) -> bytes:
        return _HEADER.pack(self.seq, self.terminal) + self.state.SerializeToString()

    @classmethod
    def from_bytes(cls, payload: bytes) -> Change:
        seq, terminal = _HEADER.unpack_from(payload)
        state = job_pb2.Job.FromString(payload[_HEADER.size :])
        return cls.of(state, seq=seq, terminal=bool(terminal))

    @classmethod
    def of(cls, state: job_pb2.Job, *, seq: int, terminal: bool) -> Change:
        return cls(
            job_id=state.job_id,
            user_id=state.user_id,
            version=state.version,
            seq=seq,
            terminal=terminal,
            state=state,
        )


def is_terminal(state: job_pb2.Job) -> bool:
    return state.status in _TERMINAL


def from_applied(applied: Any) -> Change:
    """The projection's AppliedState (services/notify/projection.py) as a Change. Read by
    attribute so that the streams do not depend on the projection's module: it needs
    ``state`` (a Job or its serialized bytes) and ``seq``."""
    state = applied.state
    if isinstance(state, bytes | bytearray | memoryview):
        state = job_pb2.Job.FromString(bytes(state))
    return Change.of(state, seq=int(applied.seq), terminal=is_terminal(state))


@dataclass(frozen=True)
class Snapshot:
    """What a WatchJobs stream sends before its live changes."""

    changes: list[Change]
    # The cursor after the snapshot: resume from here.
    cursor: int
    # More changed since the cursor than a snapshot holds: the cursor cannot be honoured.
    expired: bool
    # The cursor is beyond the user's latest change, so it was never handed out to them
    # (the data was reset, or it is made up): resuming would skip every change until the
    # server caught up with it.
    ahead: bool = False

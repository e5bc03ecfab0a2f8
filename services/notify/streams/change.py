"""One applied job state as the streams see it."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import job_state_pb2, notify_service_pb2

_TERMINAL = frozenset(
    {job_pb2.JOB_STATUS_SUCCEEDED, job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELLED}
)

# The Redis payload: seq and terminal flag, then the serialized JobState.
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
    state: job_state_pb2.JobState
    # The WatchJob message for this state, built once however many streams send it.
    _response: list[notify_service_pb2.WatchJobResponse] = field(
        default_factory=list, compare=False, repr=False
    )

    def job_response(self) -> notify_service_pb2.WatchJobResponse:
        if not self._response:
            self._response.append(notify_service_pb2.WatchJobResponse(job=self.state))
        return self._response[0]

    def to_bytes(self) -> bytes:
        return _HEADER.pack(self.seq, self.terminal) + self.state.SerializeToString()

    @classmethod
    def from_bytes(cls, payload: bytes) -> Change:
        seq, terminal = _HEADER.unpack_from(payload)
        state = job_state_pb2.JobState.FromString(payload[_HEADER.size :])
        return cls.of(state, seq=seq, terminal=bool(terminal))

    @classmethod
    def of(cls, state: job_state_pb2.JobState, *, seq: int, terminal: bool) -> Change:
        return cls(
            job_id=state.job_id,
            user_id=state.user_id,
            version=state.version,
            seq=seq,
            terminal=terminal,
            state=state,
        )


def is_terminal(state: job_state_pb2.JobState) -> bool:
    return state.status in _TERMINAL


def from_applied(applied: Any) -> Change:
    """The projection's AppliedState (services/notify/projection.py) as a Change. Read by
    attribute so that the streams do not depend on the projection's module: it needs
    ``state`` (a JobState or its serialized bytes) and ``seq``."""
    state = applied.state
    if isinstance(state, bytes | bytearray | memoryview):
        state = job_state_pb2.JobState.FromString(bytes(state))
    return Change.of(state, seq=int(applied.seq), terminal=is_terminal(state))

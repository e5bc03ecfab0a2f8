"""The projection's rules (pure): the latest state of every job, moved only forward.

Delivery from creation's outbox is at least once, so the same version arrives again and
versions arrive out of order. A row therefore moves only to a higher version: duplicates
and stale versions change nothing and are not reported as moved. Each move draws the next
``seq``, the cursor WatchJobs resumes from (store/projection.py runs the upsert and
explains why applies commit in the order they drew it).

A batch may hold several versions of one job; the row takes the newest, and each move
also carries the versions it passed, since each of them is owed its pushes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atelier.creation.v1 import job_pb2

Job = job_pb2.Job

_TERMINAL = frozenset(
    {
        job_pb2.JOB_STATUS_SUCCEEDED,
        job_pb2.JOB_STATUS_FAILED,
        job_pb2.JOB_STATUS_CANCELLED,
    }
)
_STATUS_PREFIX = "JOB_STATUS_"


@dataclass(frozen=True)
class AppliedState:
    """A job's state as the projection holds it, with the ``seq`` its last move drew."""

    state: job_pb2.Job
    seq: int

    @property
    def job_id(self) -> str:
        return self.state.job_id

    @property
    def user_id(self) -> str:
        return self.state.user_id

    @property
    def version(self) -> int:
        return self.state.version


def status_name(state: job_pb2.Job) -> str:
    """creation's name for the state's status (``queued``, ``running``, ...)."""
    return job_pb2.JobStatus.Name(state.status).removeprefix(_STATUS_PREFIX).lower()


def is_terminal(state: job_pb2.Job) -> bool:
    return state.status in _TERMINAL


def newest_per_job(states: Sequence[job_pb2.Job]) -> list[job_pb2.Job]:
    """The highest version of each job among ``states``, ordered by job id (one upsert may
    touch a row only once; a fixed order keeps lock order the same everywhere)."""
    newest: dict[str, job_pb2.Job] = {}
    for state in states:
        held = newest.get(state.job_id)
        if held is None or state.version > held.version:
            newest[state.job_id] = state
    return [newest[job_id] for job_id in sorted(newest)]


def versions_per_job(
    states: Sequence[job_pb2.Job],
) -> dict[str, dict[int, job_pb2.Job]]:
    """Each job's states in ``states``, one per version (a duplicate is the same state)."""
    per_job: dict[str, dict[int, job_pb2.Job]] = {}
    for state in states:
        per_job.setdefault(state.job_id, {})[state.version] = state
    return per_job


@dataclass(frozen=True)
class Moved:
    """A row the projection moved, with the status it held before (None: a new job) and
    the states of the batch it moved past: newer than the row held, older than where it
    moved to, in version order. The row keeps only the newest, but each of those states
    happened, and push planning owes each its pushes (a job's end followed in the same
    batch by its deletion's tombstone)."""

    applied: AppliedState
    previous_status: str | None
    passed: tuple[job_pb2.Job, ...] = ()

    def steps(self) -> list[tuple[job_pb2.Job, str | None]]:
        """Every state this move went through, oldest first, each with the status the
        job held just before it."""
        steps = []
        before = self.previous_status
        for state in (*self.passed, self.applied.state):
            steps.append((state, before))
            before = status_name(state)
        return steps


def moved(
    seq: int,
    previous_status: str | None,
    previous_version: int | None,
    versions: dict[int, job_pb2.Job],
) -> Moved:
    """The move of one row to its job's newest state in ``versions`` (drawing ``seq``),
    past the batch's states between the version the row held (None: a new job) and that
    one."""
    ordered = sorted(versions)
    held = previous_version or 0
    return Moved(
        AppliedState(versions[ordered[-1]], seq),
        previous_status,
        tuple(versions[v] for v in ordered[:-1] if v > held),
    )

"""What every job change writes beside the job row, in the same transaction: an audit
event when the status changed, the ledger entry the new status calls for, and exactly one
outbox row per new version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from services.creation.domain import Actor, Job, LedgerKind, Status, ledger_effect
from services.creation.tables import job_events, outbox, points_ledger

OUTBOX_CHANNEL = "creation_outbox"


@dataclass(frozen=True)
class Change:
    before: Status | None  # None: the job was just created
    after: Job
    actor: Actor
    actor_id: str
    reason: str = ""

    @property
    def status_changed(self) -> bool:
        return self.before is not self.after.status


def outbox_payload(job: Job) -> dict[str, Any]:
    """The outbox row's payload: the job's ``atelier.notify.v1.JobState`` in protobuf's
    JSON form (readable in psql), written without protobuf so the store stays free of the
    wire types; a unit test holds it equal to json_format of ``convert.job_state``."""
    payload = _state(job.job_id, job.user_id, job.version, job.status, job.updated_at)
    if job.deleted_at is not None:
        # A tombstone: the job is gone for its owner, nothing else of it is told.
        return {**payload, "done": True, "deleted": True}
    # Like protobuf's JSON, default values are left out.
    if job.step is not None:
        payload["step"] = f"JOB_STEP_{job.step.name}"
    if job.progress:
        payload["progressPercent"] = job.progress
    if job.cancel_requested:
        payload["cancelRequested"] = True
    if job.outputs:
        payload["outputs"] = [{"assetId": asset_id} for asset_id in job.outputs]
    if job.error_code is not None:
        error = {"code": job.error_code}
        if job.error_message:
            error["message"] = job.error_message
        payload["error"] = error
    if job.status.terminal:
        payload["done"] = True
    if job.attempt:
        payload["attempt"] = job.attempt
    if job.status is Status.QUEUED:
        payload["nextAttemptTime"] = json_time(job.next_attempt_at)
    return payload


def submitted_payload(job_id: str, user_id: str, now: datetime) -> dict[str, Any]:
    """The payload of a job's first version, known before its row is written (nothing but
    its identity, status and time is set yet): equal to ``outbox_payload`` of that row."""
    # A new job may start at once: its next attempt is due when it was submitted.
    return {**_state(job_id, user_id, 1, Status.QUEUED, now), "nextAttemptTime": json_time(now)}


def _state(
    job_id: str, user_id: str, version: int, status: Status, updated_at: datetime
) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "userId": user_id,
        "version": str(version),  # int64 is a string in protobuf's JSON
        "status": f"JOB_STATUS_{status.name}",
        "updateTime": json_time(updated_at),
    }


def json_time(value: datetime) -> str:
    """RFC 3339 in UTC with 0, 3 or 6 fractional digits, as protobuf writes a Timestamp."""
    utc = value.astimezone(UTC)
    micros = utc.microsecond
    if micros == 0:
        fraction = ""
    elif micros % 1000 == 0:
        fraction = f".{micros // 1000:03d}"
    else:
        fraction = f".{micros:06d}"
    return utc.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _ledger_kind(change: Change) -> LedgerKind | None:
    if change.before is None:
        return LedgerKind.RESERVE
    return ledger_effect(change.after.status) if change.status_changed else None


async def record(connection: AsyncConnection, changes: Sequence[Change], now: datetime) -> None:
    """Writes the side rows of ``changes`` (one multi-row INSERT per table)."""
    if not changes:
        return
    events = [
        {
            "job_id": c.after.job_id,
            "version": c.after.version,
            "from_status": c.before.value if c.before else None,
            "to_status": c.after.status.value,
            "actor_kind": c.actor.value,
            "actor_id": c.actor_id,
            "reason": c.reason,
            "created_at": now,
        }
        for c in changes
        if c.status_changed
    ]
    entries = [
        {
            "user_id": c.after.user_id,
            "job_id": c.after.job_id,
            "kind": kind.value,
            "amount": c.after.price_points,
            "reason": c.reason,
            "created_at": now,
        }
        for c in changes
        if (kind := _ledger_kind(c)) is not None
    ]
    messages = [
        {
            "job_id": c.after.job_id,
            "user_id": c.after.user_id,
            "version": c.after.version,
            "payload": outbox_payload(c.after),
            "created_at": now,
        }
        for c in changes
    ]
    if events:
        await connection.execute(insert(job_events), events)
    if entries:
        # In user order: the ledger's trigger locks each user's totals row, and every
        # writer takes those locks in this order (Python's str order is the trigger's
        # COLLATE "C"; see migration 0013), whether the rows go as one statement or many.
        entries.sort(key=lambda entry: entry["user_id"])
        await connection.execute(insert(points_ledger), entries)
    # A statement trigger on the outbox sends NOTIFY on OUTBOX_CHANNEL, delivered at
    # commit and only if the transaction commits: no writer can forget to wake the relay.
    await connection.execute(insert(outbox), messages)

"""What every job change writes beside the job row, in the same transaction: an audit
event when the status changed, the ledger entry the new status calls for, and exactly one
outbox row per new version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from services.creation.convert import outbox_payload
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
        await connection.execute(insert(points_ledger), entries)
    # A statement trigger on the outbox sends NOTIFY on OUTBOX_CHANNEL, delivered at
    # commit and only if the transaction commits: no writer can forget to wake the relay.
    await connection.execute(insert(outbox), messages)

"""Rows of the jobs table as domain objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.creation.domain import Job, Status, Step

# Plain lookups: a worker turns every row it writes back into a Job, thousands a second.
STATUSES = {status.value: status for status in Status}
_STEPS = {step.value: step for step in Step}


def job_from_row(row: Mapping[Any, Any]) -> Job:
    return Job(
        job_id=str(row["job_id"]),
        user_id=row["user_id"],
        model_id=row["model_id"],
        style_id=row["style_id"],
        provider_code=row["provider_code"],
        provider_model=row["provider_model"],
        price_points=row["price_points"],
        input_asset_id=None if row["input_asset_id"] is None else str(row["input_asset_id"]),
        prompt=row["prompt"],
        negative_prompt=row["negative_prompt"],
        width=row["width"],
        height=row["height"],
        parameters=dict(row["parameters"]),
        status=STATUSES[row["status"]],
        progress=row["progress"],
        step=_STEPS[row["step"]] if row["step"] else None,
        priority=row["priority"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        next_attempt_at=row["next_attempt_at"],
        lease_owner=row["lease_owner"],
        lease_epoch=row["lease_epoch"],
        lease_expires_at=row["lease_expires_at"],
        provider_request_id=row["provider_request_id"],
        error_code=row["error_code"],
        error_message=row["error_message"],
        error_reason=row["error_reason"],
        error_retryable=row["error_retryable"],
        cancel_requested=row["cancel_requested"],
        num_outputs=row["num_outputs"],
        outputs=tuple(str(asset_id) for asset_id in row["outputs"] or ()),
        idempotency_key=row["idempotency_key"],
        request_hash=row["request_hash"],
        version=row["version"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        completed_at=row["completed_at"],
        updated_at=row["updated_at"],
        trace_parent=row["trace_parent"],
        deleted_at=row["deleted_at"],
        provider_version=row["provider_version"],
    )

"""A delivery's body: ``{"type", "timestamp", "data"}``, where data is the v1 Job as the
edge prints GetJob's answer (camelCase names, enums by name, every field without
presence printed, int64 as strings), its outputs with fresh signed URLs as GetJob gives
them. Read from the delivery's payload (creation.job_message, built at its fan-out)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from atelier.creation.v1 import job_pb2
from services.creation.convert import fill_output_urls
from services.creation.media_client import OutputUrls
from services.creation.relay.jobs import read_job
from services.creation.webhooks.printing import rfc3339, to_dict


def job_of(payload: Any) -> job_pb2.Job:
    job = job_pb2.Job()
    read_job(payload, job)
    return job


def body(
    event_type: str, occurred_at: datetime, job: job_pb2.Job, urls: Mapping[str, OutputUrls]
) -> bytes:
    if urls:
        fill_output_urls(job, urls)
    data = to_dict(job)
    document = {"type": event_type, "timestamp": rfc3339(occurred_at), "data": data}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()

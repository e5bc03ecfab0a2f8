"""The reference remote worker's settings (ATELIER_REMOTE_WORKER_*): where it calls, as
which pool and worker, how many jobs at once. The credential is a secret: never echoed."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field

from services.creation.remote_worker.client import FAULTS
from services.kit.settings import EnvReader


@dataclass(frozen=True)
class RemoteWorkerSettings:
    credential: str = field(repr=False)
    worker_id: str
    concurrency: int
    poll_seconds: float
    provider_poll_seconds: float
    drain_seconds: float
    lease_seconds: float
    fault: str
    # The in-process worker's defaults (ATELIER_BACKOFF_BASE, _MAX).
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 300.0

    @classmethod
    def read(cls, reader: EnvReader) -> RemoteWorkerSettings:
        default_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        settings = cls(
            # The pool's credential (the server knows its SHA-256 from ATELIER_REMOTE_POOLS).
            credential=reader.secret("REMOTE_WORKER_CREDENTIAL", "", min_length=16),
            worker_id=reader.string("REMOTE_WORKER_ID", "") or default_id,
            # Jobs this worker runs at once.
            concurrency=reader.integer("REMOTE_WORKER_CONCURRENCY", 4, minimum=1, maximum=256),
            # How long to wait before claiming again after a claim found nothing.
            poll_seconds=reader.seconds("REMOTE_WORKER_POLL", 1, minimum=0.01, maximum=60),
            # How often a running job asks its provider how it is going.
            provider_poll_seconds=reader.seconds(
                "REMOTE_WORKER_PROVIDER_POLL", 1, minimum=0.01, maximum=60
            ),
            # On SIGTERM, how long running jobs may take before they are handed back.
            drain_seconds=reader.seconds("REMOTE_WORKER_DRAIN", 8, minimum=0, maximum=300),
            # The lease to ask for (0: the server's default; the server applies its bounds).
            lease_seconds=reader.seconds("REMOTE_WORKER_LEASE", 0, minimum=0, maximum=86400),
            # Tests only: drop_first_claim throws away the first claim's answer and replays.
            fault=reader.string("REMOTE_WORKER_FAULT", "", choices=FAULTS),
            # The backoff between a provider's poll errors (full jitter, doubling from the
            # base up to the longest), never sooner than the provider asked.
            backoff_base_seconds=reader.seconds(
                "REMOTE_WORKER_BACKOFF_BASE", 2, minimum=0.01, maximum=600
            ),
            backoff_max_seconds=reader.seconds(
                "REMOTE_WORKER_BACKOFF_MAX", 300, minimum=0.01, maximum=86400
            ),
        )
        reader.require(
            settings.backoff_base_seconds <= settings.backoff_max_seconds,
            "REMOTE_WORKER_BACKOFF_BASE",
            "must not exceed ATELIER_REMOTE_WORKER_BACKOFF_MAX",
        )
        return settings

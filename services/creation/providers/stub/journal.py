"""What the stub remembers beyond one process: its accepted requests and its ledger.

A real provider keeps a request after the worker that submitted it dies; so does the stub,
in ``state_dir``: one file per request (a JSON header line, then the input bytes), written
to a temporary name and renamed, so a crash never leaves half a request. Any process that
shares the directory can answer a poll for it, and recomputes the same output (the
generation is deterministic). Files stay until the directory is cleaned (``var/`` in
development), like a provider's retention; a cancel drops the input at once.

Each request is also listed under ``by-job/<job id>/`` (an empty file named by the request
id), written before the request itself: the stub finds a job's requests by our reference
the way a vendor that keeps client metadata would, and a crash between the two leaves only
a listing that names no request, which lookups skip.

The ledger (optional) is one line per accepted submit, ``job_id request_id``, appended
with O_APPEND so that lines from several processes never interleave: tests read it to
assert how many times each job reached the provider.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

_REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")
_JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class StubRequest:
    request_id: str
    job_id: str
    attempt: int
    style_id: str
    provider_model: str
    num_outputs: int
    content_type: str
    # Wall-clock seconds (the stub's clock) when the request was accepted.
    submitted_at: float
    # Set by cancel, which also drops the input: polls answer CANCELLED from then on.
    cancelled: bool = False
    # The size asked for; 0 (a request stored before sizes were kept): the input's.
    width: int = 0
    height: int = 0
    # Set for a request without an input image (text-to-image): the prompt is painted.
    text_only: bool = False
    prompt: str = ""

    @property
    def size(self) -> tuple[int, int] | None:
        return (self.width, self.height) if self.width > 0 and self.height > 0 else None


def new_request_id() -> str:
    return uuid.uuid4().hex


class RequestStore:
    """Accepted requests under one directory. Blocking; call from a worker thread."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def _path(self, request_id: str) -> Path | None:
        # The id names a file: only ids this stub could have made are looked up.
        if not _REQUEST_ID.fullmatch(request_id):
            return None
        return self._directory / f"{request_id}.req"

    def _listing(self, job_id: str) -> Path | None:
        # Only job ids (UUIDs) name a folder: nothing else can reach the file system.
        if not _JOB_ID.fullmatch(job_id):
            return None
        return self._directory / "by-job" / job_id

    def save(self, request: StubRequest, input_data: bytes) -> None:
        path = self._path(request.request_id)
        if path is None:
            raise ValueError(f"not a stub request id: {request.request_id!r}")
        self._directory.mkdir(parents=True, exist_ok=True)
        listing = self._listing(request.job_id)
        if listing is not None:
            listing.mkdir(parents=True, exist_ok=True)
            (listing / request.request_id).touch()
        partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
        try:
            with partial.open("wb") as file:
                file.write(json.dumps(asdict(request)).encode() + b"\n")
                file.write(input_data)
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise

    def load(self, request_id: str) -> tuple[StubRequest, bytes] | None:
        path = self._path(request_id)
        if path is None:
            return None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        header, _, input_data = raw.partition(b"\n")
        return StubRequest(**json.loads(header)), input_data

    def for_job(self, job_id: str) -> list[StubRequest]:
        """The requests accepted for ``job_id``, oldest first."""
        listing = self._listing(job_id)
        if listing is None or not listing.is_dir():
            return []
        found = []
        for entry in listing.iterdir():
            loaded = self.load(entry.name)
            if loaded is not None and loaded[0].job_id == job_id:
                found.append(loaded[0])
        return sorted(found, key=lambda r: (r.submitted_at, r.request_id))

    def cancel(self, request_id: str) -> None:
        """Marks a known request cancelled and drops its input; unknown ids are ignored."""
        found = self.load(request_id)
        if found is not None:
            self.save(replace(found[0], cancelled=True), b"")


def append_ledger(path: Path, job_id: str, request_id: str) -> None:
    """Records one accepted submit. Blocking."""
    line = f"{job_id} {request_id}\n".encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


def read_ledger(path: Path) -> dict[str, list[str]]:
    """job_id -> the request ids of its accepted submits, in order (for tests)."""
    submits: dict[str, list[str]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            job_id, _, request_id = line.partition(" ")
            submits[job_id].append(request_id)
    return dict(submits)

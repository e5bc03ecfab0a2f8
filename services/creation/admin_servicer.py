"""AdminService (internal listener only): operators' view of jobs and points."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from grpc import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc
from services.creation import convert, submission
from services.creation.errors import Reason
from services.creation.store import admin as admin_store
from services.creation.store import ledger
from services.creation.store.jobs import Cursor
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.pagination import decode_token, encode_token, invalid_page_token, page_size

Context = aio.ServicerContext[Any, Any]

_DECISIONS = {
    admin_service_pb2.RESOLUTION_RETRY: admin_store.Decision.RETRY,
    admin_service_pb2.RESOLUTION_FAIL: admin_store.Decision.FAIL,
    admin_service_pb2.RESOLUTION_CANCEL: admin_store.Decision.CANCEL,
}
MAX_TEXT = 500


def _required_text(name: str, value: str, problems: list[FieldViolation]) -> str:
    value = value.strip()
    if not value:
        problems.append(FieldViolation(name, "is required"))
    elif len(value) > MAX_TEXT:
        problems.append(FieldViolation(name, f"must be at most {MAX_TEXT} characters"))
    return value


def _job_id(value: str, problems: list[FieldViolation]) -> str:
    if not submission.is_uuid(value):
        problems.append(FieldViolation("job_id", "must be a UUID"))
    return value.lower()


def _check(problems: list[FieldViolation]) -> None:
    if problems:
        raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)


class AdminServicer(admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(
        self, engine: AsyncEngine, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._engine = engine
        self._clock = clock

    async def ListAttentionJobs(
        self, request: admin_service_pb2.ListAttentionJobsRequest, context: Context
    ) -> admin_service_pb2.ListAttentionJobsResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        after = None
        if request.page_token:
            position = decode_token(request.page_token, ("t", "j"))
            try:
                after = Cursor(datetime.fromisoformat(str(position["t"])), str(position["j"]))
            except ValueError:
                raise invalid_page_token() from None
        found, cursor = await admin_store.list_attention(self._engine, limit, after)
        token = (
            encode_token({"t": cursor.created_at.isoformat(), "j": cursor.job_id}) if cursor else ""
        )
        return admin_service_pb2.ListAttentionJobsResponse(
            jobs=[convert.job_message(j) for j in found], next_page_token=token
        )

    async def ResolveJob(
        self, request: admin_service_pb2.ResolveJobRequest, context: Context
    ) -> admin_service_pb2.ResolveJobResponse:
        problems: list[FieldViolation] = []
        job_id = _job_id(request.job_id, problems)
        decision = _DECISIONS.get(request.resolution)
        if decision is None:
            problems.append(FieldViolation("resolution", "must be RETRY, FAIL or CANCEL"))
        operator = _required_text("operator", request.operator, problems)
        reason = _required_text("reason", request.reason, problems)
        if decision is None or problems:
            raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)
        job = await admin_store.resolve(
            self._engine, job_id, decision, operator, reason, self._clock()
        )
        return admin_service_pb2.ResolveJobResponse(job=convert.job_message(job))

    async def ListJobEvents(
        self, request: admin_service_pb2.ListJobEventsRequest, context: Context
    ) -> admin_service_pb2.ListJobEventsResponse:
        problems: list[FieldViolation] = []
        job_id = _job_id(request.job_id, problems)
        _check(problems)
        limit = page_size(request.page_size, default=100, maximum=500)
        after = 0
        if request.page_token:
            position = decode_token(request.page_token, ("e",))
            if not isinstance(position["e"], int):
                raise invalid_page_token()
            after = position["e"]
        events, last = await admin_store.list_events(self._engine, job_id, limit, after)
        return admin_service_pb2.ListJobEventsResponse(
            events=[convert.event_message(e) for e in events],
            next_page_token=encode_token({"e": last}) if last is not None else "",
        )

    async def GrantPoints(
        self, request: admin_service_pb2.GrantPointsRequest, context: Context
    ) -> admin_service_pb2.GrantPointsResponse:
        problems: list[FieldViolation] = []
        user_id = _required_text("user_id", request.user_id, problems)
        key = _required_text("request_id", request.request_id, problems)
        if not 0 < request.amount <= 1_000_000_000:
            problems.append(FieldViolation("amount", "must be between 1 and 1000000000"))
        _check(problems)
        balance = await ledger.grant_points(
            self._engine, user_id, request.amount, key, request.reason.strip(), self._clock()
        )
        return admin_service_pb2.GrantPointsResponse(available_points=balance.available)

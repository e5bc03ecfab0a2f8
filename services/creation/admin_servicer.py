"""AdminService (internal listener only): operators' view of jobs and points, and the
webhook endpoints (webhook_servicer)."""

from __future__ import annotations

from typing import Any

from grpc import aio

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc
from services.creation import convert, submission
from services.creation.admin_convert import inspection_message, overview_message
from services.creation.errors import Reason
from services.creation.operators import Operators
from services.creation.store.admin import AttentionCursor, Decision, EventCursor
from services.creation.store.ledger_entries import EntryCursor
from services.creation.webhook_admin import WebhookOperators
from services.creation.webhook_rules import UrlRule
from services.creation.webhook_servicer import WebhookAdminMethods
from services.kit.auth import current_principal, principal_id_problem
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.ids import is_uuid
from services.kit.pagination import Integer, KeysetCodec, Timestamp, Uuid, page_size

Context = aio.ServicerContext[Any, Any]

_DECISIONS = {
    admin_service_pb2.RESOLUTION_RETRY: Decision.RETRY,
    admin_service_pb2.RESOLUTION_FAIL: Decision.FAIL,
    admin_service_pb2.RESOLUTION_CANCEL: Decision.CANCEL,
    admin_service_pb2.RESOLUTION_ADOPT: Decision.ADOPT,
}
# A provider's request id, as an operator pastes it (fal's holds slashes).
MAX_REQUEST_ID = 200
MAX_TEXT = 500
# The needs-attention queue, oldest change first.
ATTENTION_PAGES = KeysetCodec(
    "attention_jobs", AttentionCursor, updated_at=Timestamp(), job_id=Uuid()
)
# A job's events, oldest first; bound to the job.
EVENT_PAGES = KeysetCodec("job_events", EventCursor, event_id=Integer())
# A user's ledger for an operator, newest first; bound to the user.
USER_LEDGER_PAGES = KeysetCodec("user_ledger", EntryCursor, entry_id=Integer())


def _text(name: str, value: str, problems: list[FieldViolation], *, required: bool = True) -> str:
    value = value.strip()
    if not value:
        if required:
            problems.append(FieldViolation(name, "is required"))
    elif len(value) > MAX_TEXT:
        problems.append(FieldViolation(name, f"must be at most {MAX_TEXT} characters"))
    elif submission.has_control_characters(value):
        problems.append(FieldViolation(name, "must not contain control characters"))
    return value


def _job_id(value: str, problems: list[FieldViolation]) -> str:
    if not is_uuid(value):
        problems.append(FieldViolation("job_id", "must be a UUID"))
    return value.lower()


def _user_id(value: str, problems: list[FieldViolation]) -> str:
    problem = principal_id_problem(value)
    if problem is not None:
        problems.append(FieldViolation("user_id", problem))
    return value


def _operator(named: str, problems: list[FieldViolation]) -> str:
    """Who decides: the caller's own identity (ATELIER_SERVICE_IDENTITIES), which the
    request may repeat but not contradict; with the shared service credential, which names
    nobody, the request's ``operator``."""
    identity = current_principal().identity
    if not identity:
        return _text("operator", named, problems)
    named = named.strip()
    if named and named != identity:
        problems.append(
            FieldViolation("operator", f"must be empty or the caller's identity ({identity})")
        )
    return identity


def _provider_request_id(
    value: str, decision: Decision | None, problems: list[FieldViolation]
) -> str:
    """Required with ADOPT, refused with any other decision."""
    value = value.strip()
    if decision is not Decision.ADOPT:
        if value:
            problems.append(FieldViolation("provider_request_id", "is only for RESOLUTION_ADOPT"))
        return value
    if not value:
        problems.append(FieldViolation("provider_request_id", "is required to adopt"))
    elif len(value) > MAX_REQUEST_ID or not value.isprintable() or " " in value:
        problems.append(
            FieldViolation(
                "provider_request_id",
                f"must be 1-{MAX_REQUEST_ID} printable characters without spaces",
            )
        )
    return value


def _check(problems: list[FieldViolation]) -> None:
    if problems:
        raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)


class AdminServicer(WebhookAdminMethods, admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        operators: Operators,
        webhooks: WebhookOperators,
        url_rule: UrlRule | None = None,
        signing_owners: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(webhooks, url_rule or UrlRule(), signing_owners)
        self._operators = operators

    async def ListAttentionJobs(
        self, request: admin_service_pb2.ListAttentionJobsRequest, context: Context
    ) -> admin_service_pb2.ListAttentionJobsResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        after = ATTENTION_PAGES.decode(request.page_token) if request.page_token else None
        found, cursor = await self._operators.attention(limit, after)
        return admin_service_pb2.ListAttentionJobsResponse(
            jobs=[convert.job_message(j) for j in found],
            next_page_token=ATTENTION_PAGES.encode(cursor) if cursor else "",
        )

    async def ResolveJob(
        self, request: admin_service_pb2.ResolveJobRequest, context: Context
    ) -> admin_service_pb2.ResolveJobResponse:
        problems: list[FieldViolation] = []
        job_id = _job_id(request.job_id, problems)
        decision = _DECISIONS.get(request.resolution)
        if decision is None:
            problems.append(FieldViolation("resolution", "must be ADOPT, RETRY, FAIL or CANCEL"))
        request_id = _provider_request_id(request.provider_request_id, decision, problems)
        operator = _operator(request.operator, problems)
        reason = _text("reason", request.reason, problems)
        if decision is None or problems:
            raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)
        if decision is Decision.ADOPT:
            job = await self._operators.adopt(job_id, request_id, operator, reason)
        else:
            job = await self._operators.resolve(job_id, decision, operator, reason)
        return admin_service_pb2.ResolveJobResponse(job=convert.job_message(job))

    async def InspectJob(
        self, request: admin_service_pb2.InspectJobRequest, context: Context
    ) -> admin_service_pb2.InspectJobResponse:
        problems: list[FieldViolation] = []
        job_id = _job_id(request.job_id, problems)
        _check(problems)
        return inspection_message(await self._operators.inspect(job_id))

    async def GetCaller(
        self, request: admin_service_pb2.GetCallerRequest, context: Context
    ) -> admin_service_pb2.GetCallerResponse:
        caller = current_principal()
        return admin_service_pb2.GetCallerResponse(identity=caller.identity, role=caller.role)

    async def GetQueueOverview(
        self, request: admin_service_pb2.GetQueueOverviewRequest, context: Context
    ) -> admin_service_pb2.GetQueueOverviewResponse:
        limit = page_size(request.running_page_size, default=50, maximum=200)
        return overview_message(await self._operators.overview(limit))

    async def SearchJobs(
        self, request: admin_service_pb2.SearchJobsRequest, context: Context
    ) -> admin_service_pb2.SearchJobsResponse:
        problems: list[FieldViolation] = []
        limit = page_size(request.page_size, default=20, maximum=100)
        query = request.WhichOneof("query")
        if query == "job_id":
            job_id = _job_id(request.job_id, problems)
            _check(problems)
            found = await self._operators.find_job(job_id)
        elif query == "user_id":
            user_id = _user_id(request.user_id, problems)
            _check(problems)
            found = await self._operators.user_jobs(user_id, limit)
        else:
            raise invalid_argument(
                Reason.INVALID_ADMIN_REQUEST, [FieldViolation("query", "set job_id or user_id")]
            )
        return admin_service_pb2.SearchJobsResponse(jobs=[convert.job_message(j) for j in found])

    async def ListUserLedger(
        self, request: admin_service_pb2.ListUserLedgerRequest, context: Context
    ) -> admin_service_pb2.ListUserLedgerResponse:
        problems: list[FieldViolation] = []
        user_id = _user_id(request.user_id, problems)
        _check(problems)
        limit = page_size(request.page_size, default=20, maximum=100)
        after = (
            USER_LEDGER_PAGES.decode(request.page_token, user_id) if request.page_token else None
        )
        balance, entries, cursor = await self._operators.user_ledger(user_id, limit, after)
        return admin_service_pb2.ListUserLedgerResponse(
            available_points=balance.available,
            reserved_points=balance.reserved,
            ledger_entries=[convert.ledger_entry_message(e) for e in entries],
            next_page_token=USER_LEDGER_PAGES.encode(cursor, user_id) if cursor else "",
        )

    async def ListJobEvents(
        self, request: admin_service_pb2.ListJobEventsRequest, context: Context
    ) -> admin_service_pb2.ListJobEventsResponse:
        problems: list[FieldViolation] = []
        job_id = _job_id(request.job_id, problems)
        _check(problems)
        limit = page_size(request.page_size, default=100, maximum=500)
        after = EVENT_PAGES.decode(request.page_token, job_id) if request.page_token else None
        events, cursor = await self._operators.events(job_id, limit, after)
        return admin_service_pb2.ListJobEventsResponse(
            events=[convert.event_message(e) for e in events],
            next_page_token=EVENT_PAGES.encode(cursor, job_id) if cursor else "",
        )

    async def GrantPoints(
        self, request: admin_service_pb2.GrantPointsRequest, context: Context
    ) -> admin_service_pb2.GrantPointsResponse:
        problems: list[FieldViolation] = []
        user_id = _user_id(request.user_id, problems)
        key, key_problems = submission.choose_idempotency_key(request.request_id, None)
        problems.extend(key_problems)
        if key is None and not key_problems:
            problems.append(FieldViolation("request_id", "is required"))
        if not 0 < request.amount <= 1_000_000_000:
            problems.append(FieldViolation("amount", "must be between 1 and 1000000000"))
        reason = _text("reason", request.reason, problems, required=False)
        if key is None or problems:
            raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)
        available = await self._operators.grant(
            user_id, request.amount, key, reason, granted_by=current_principal().identity
        )
        return admin_service_pb2.GrantPointsResponse(available_points=available)

"""NotifyAdminService (internal listener only, the operator role): the pushes that did not
reach a device. Thin: the request checked, the store asked, the answer built. A device
token is never answered, only its last characters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2
from grpc import aio

from atelier.notify.v1 import notify_admin_service_pb2 as pb
from atelier.notify.v1 import notify_admin_service_pb2_grpc, notify_service_pb2
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.pagination import EARLIEST, LATEST, Integer, KeysetCodec, Timestamp, page_size
from services.kit.timestamps import to_timestamp
from services.notify import fields
from services.notify.domain import FailedPush, FailedPushCursor
from services.notify.errors import Reason
from services.notify.store import FailedPushReads

Context = aio.ServicerContext[Any, Any]

FAILED_PUSH_PAGES = KeysetCodec(
    "failed_pushes", FailedPushCursor, created_at=Timestamp(), push_id=Integer()
)
_KINDS = {
    "alert": pb.PUSH_KIND_ALERT,
    "la_start": pb.PUSH_KIND_LIVE_ACTIVITY_START,
    "la_update": pb.PUSH_KIND_LIVE_ACTIVITY_UPDATE,
    "la_end": pb.PUSH_KIND_LIVE_ACTIVITY_END,
}
_STATES = {
    "failed": pb.FAILED_PUSH_STATE_FAILED,
    "dropped": pb.FAILED_PUSH_STATE_TOKEN_REFUSED,
}
_ENVIRONMENTS = {name: value for value, name in fields.ENVIRONMENTS.items()}
_NO_ENVIRONMENT = notify_service_pb2.APNS_ENVIRONMENT_UNSPECIFIED


def _time(
    name: str, stamp: timestamp_pb2.Timestamp, given: bool, problems: list[FieldViolation]
) -> datetime | None:
    if not given:
        return None
    try:
        value = stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        value = None
    if value is None or not EARLIEST <= value <= LATEST:
        problems.append(FieldViolation(name, "is not a time PostgreSQL can hold"))
        return None
    return value


def time_range(request: pb.ListFailedPushesRequest) -> tuple[datetime | None, datetime | None]:
    """The request's [since, until), checked."""
    problems: list[FieldViolation] = []
    since = _time("since", request.since, request.HasField("since"), problems)
    until = _time("until", request.until, request.HasField("until"), problems)
    if since is not None and until is not None and until <= since:
        problems.append(FieldViolation("until", "must be after since"))
    if problems:
        raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)
    return since, until


def failed_push_message(push: FailedPush) -> pb.FailedPush:
    message = pb.FailedPush(
        push_id=push.push_id,
        kind=_KINDS.get(push.kind, pb.PUSH_KIND_UNSPECIFIED),
        state=_STATES.get(push.status, pb.FAILED_PUSH_STATE_UNSPECIFIED),
        job_id=push.job_id,
        job_version=push.version,
        user_id=push.user_id,
        device_token_suffix=push.token_suffix,
        environment=_ENVIRONMENTS.get(
            push.environment, notify_service_pb2.APNS_ENVIRONMENT_UNSPECIFIED
        ),
        http_status=push.http_status or 0,
        reason=push.reason or "",
        apns_id=push.apns_id or "",
        attempts=push.attempts,
        create_time=to_timestamp(push.created_at),
    )
    if push.last_attempt_at is not None:
        message.last_attempt_time.CopyFrom(to_timestamp(push.last_attempt_at))
    return message


class NotifyAdminServicer(notify_admin_service_pb2_grpc.NotifyAdminServiceServicer):
    def __init__(self, reads: FailedPushReads) -> None:
        self._reads = reads

    async def ListFailedPushes(
        self, request: pb.ListFailedPushesRequest, context: Context
    ) -> pb.ListFailedPushesResponse:
        limit = page_size(request.page_size, default=50, maximum=100)
        since, until = time_range(request)
        # A token belongs to the time range it was handed out for.
        binding = f"{request.since.ToJsonString() if since else ''}:" + (
            request.until.ToJsonString() if until else ""
        )
        after = (
            FAILED_PUSH_PAGES.decode(request.page_token, binding) if request.page_token else None
        )
        found, cursor = await self._reads.page(since, until, limit, after)
        return pb.ListFailedPushesResponse(
            pushes=[failed_push_message(p) for p in found],
            next_page_token=FAILED_PUSH_PAGES.encode(cursor, binding) if cursor else "",
        )

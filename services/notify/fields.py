"""Request fields checked before anything else runs: each bad field gets its request's
reason and a field violation (INVALID_ARGUMENT), never a database error. Returns the
domain's values: normalized tokens, environment names, cursors as integers."""

from __future__ import annotations

import re
from collections.abc import Sequence

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_feed_service_pb2 as feed_pb
from atelier.notify.v1 import notify_ingest_service_pb2 as ingest_pb
from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.auth import principal_id_problem
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.ids import canonical_uuid, is_uuid
from services.notify.domain import ActivityRegistration, DeviceRegistration, FeedRequest
from services.notify.errors import Reason
from services.notify.projection import Job
from services.notify.pushes import tokens

# Far above the relay's largest batch; a request past it is a bug, not load.
MAX_MESSAGES = 1000
_KNOWN_STATUSES = frozenset(job_pb2.JobStatus.values()) - {job_pb2.JOB_STATUS_UNSPECIFIED}
ENVIRONMENTS = {
    pb.APNS_ENVIRONMENT_PRODUCTION: "production",
    pb.APNS_ENVIRONMENT_SANDBOX: "sandbox",
}
# A cursor is opaque to clients; this prefix lets the format change later.
_CURSOR_PREFIX = "s"
# The most user ids, and model ids, one WatchAllJobs filter names.
MAX_FEED_FILTER_IDS = 100
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


# -- Deliver ---------------------------------------------------------------------------


def delivered_states(messages: Sequence[ingest_pb.OutboxMessage]) -> list[Job]:
    """The jobs of a Deliver batch, as creation's outbox rows hold them."""
    problems = _delivery_problems(messages)
    if problems:
        raise invalid_argument(Reason.INVALID_DELIVERY, problems)
    return [m.job for m in messages]


def _delivery_problems(messages: Sequence[ingest_pb.OutboxMessage]) -> list[FieldViolation]:
    if not messages:
        return [FieldViolation("messages", "must hold at least one message")]
    if len(messages) > MAX_MESSAGES:
        return [FieldViolation("messages", f"must hold at most {MAX_MESSAGES} messages")]
    problems: list[FieldViolation] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}].job"
        if not message.HasField("job"):
            problems.append(FieldViolation(where, "is required"))
            continue
        state = message.job
        if not is_uuid(state.job_id):
            problems.append(FieldViolation(f"{where}.job_id", "must be a job id (a UUID)"))
        user_problem = principal_id_problem(state.user_id)
        if user_problem is not None:
            problems.append(FieldViolation(f"{where}.user_id", user_problem))
        if state.version < 1:
            problems.append(FieldViolation(f"{where}.version", "must be at least 1"))
        if state.status not in _KNOWN_STATUSES:
            problems.append(FieldViolation(f"{where}.status", "must be a known job status"))
    return problems


# -- devices and Live Activities -------------------------------------------------------


def _token_violation(field: str, token: str, required: bool = True) -> list[FieldViolation]:
    if not token:
        return [FieldViolation(field, "is required")] if required else []
    problem = tokens.token_problem(token)
    return [FieldViolation(field, problem)] if problem else []


def device_registration(user_id: str, request: pb.RegisterDeviceRequest) -> DeviceRegistration:
    problems = _token_violation("device_token", request.device_token)
    problems += _token_violation("push_to_start_token", request.push_to_start_token, False)
    if request.environment not in ENVIRONMENTS:
        problems.append(FieldViolation("environment", "must be PRODUCTION or SANDBOX"))
    bundle_problem = tokens.bundle_id_problem(request.bundle_id)
    if bundle_problem:
        problems.append(FieldViolation("bundle_id", bundle_problem))
    locale_problem = tokens.locale_problem(request.locale)
    if locale_problem:
        problems.append(FieldViolation("locale", locale_problem))
    if problems:
        raise invalid_argument(Reason.INVALID_DEVICE, problems)
    start = request.push_to_start_token
    return DeviceRegistration(
        user_id=user_id,
        token=tokens.normalized_token(request.device_token),
        environment=ENVIRONMENTS[request.environment],
        bundle_id=request.bundle_id,
        locale=request.locale or tokens.DEFAULT_LOCALE,
        push_to_start_token=tokens.normalized_token(start) if start else None,
    )


def device_id(value: str) -> str:
    if not is_uuid(value):
        raise invalid_argument(
            Reason.INVALID_DEVICE_ID,
            [FieldViolation("device_id", "must be a device id (a UUID)")],
        )
    return value


def _activity_problems(job_id: str, activity_id: str) -> list[FieldViolation]:
    problems: list[FieldViolation] = []
    if not is_uuid(job_id):
        problems.append(FieldViolation("job_id", "must be a job id (a UUID)"))
    activity_problem = tokens.activity_id_problem(activity_id)
    if activity_problem:
        problems.append(FieldViolation("activity_id", activity_problem))
    return problems


def activity_registration(
    user_id: str, request: pb.RegisterLiveActivityRequest
) -> ActivityRegistration:
    problems = _activity_problems(request.job_id, request.activity_id)
    if not is_uuid(request.device_id):
        problems.append(FieldViolation("device_id", "must be a device id (a UUID)"))
    problems += _token_violation("push_token", request.push_token)
    if problems:
        raise invalid_argument(Reason.INVALID_LIVE_ACTIVITY, problems)
    return ActivityRegistration(
        user_id=user_id,
        job_id=request.job_id,
        device_id=request.device_id,
        token=tokens.normalized_token(request.push_token),
        activity_id=request.activity_id,
    )


def activity(request: pb.DeleteLiveActivityRequest) -> tuple[str, str]:
    """The (job id, activity id) a DeleteLiveActivity names."""
    problems = _activity_problems(request.job_id, request.activity_id)
    if problems:
        raise invalid_argument(Reason.INVALID_LIVE_ACTIVITY, problems)
    return request.job_id, request.activity_id


# -- streams ---------------------------------------------------------------------------


def job_id(value: str) -> str:
    """The job id of a WatchJob, in its canonical form."""
    canonical = canonical_uuid(value)
    if canonical is None:
        raise invalid_argument(Reason.INVALID_JOB_ID, [FieldViolation("job_id", "must be a UUID")])
    return canonical


def after_version(value: int) -> int:
    if value < 0:
        raise invalid_argument(
            Reason.INVALID_AFTER_VERSION,
            [FieldViolation("after_version", "must be 0 or more")],
        )
    return value


def encode_cursor(seq: int) -> str:
    return f"{_CURSOR_PREFIX}{seq}"


def decode_cursor(value: str) -> int | None:
    """The ``seq`` a WatchJobs cursor stands for; None for none (watch afresh)."""
    if not value:
        return None
    digits = value[len(_CURSOR_PREFIX) :]
    if not value.startswith(_CURSOR_PREFIX) or not digits.isdigit() or len(digits) > 18:
        raise invalid_argument(
            Reason.INVALID_CURSOR,
            [FieldViolation("cursor", "must be a cursor this server handed out")],
        )
    return int(digits)


def feed_request(request: feed_pb.WatchAllJobsRequest) -> FeedRequest:
    """A WatchAllJobs request's filter and cursor, checked (the filter first)."""
    problems: list[FieldViolation] = []
    for name, ids in (("user_ids", request.user_ids), ("model_ids", request.model_ids)):
        if len(ids) > MAX_FEED_FILTER_IDS:
            problems.append(FieldViolation(name, f"must hold at most {MAX_FEED_FILTER_IDS} ids"))
    for index, user_id in enumerate(request.user_ids[:MAX_FEED_FILTER_IDS]):
        problem = principal_id_problem(user_id)
        if problem is not None:
            problems.append(FieldViolation(f"user_ids[{index}]", problem))
    for index, model_id in enumerate(request.model_ids[:MAX_FEED_FILTER_IDS]):
        if not _MODEL_ID.fullmatch(model_id):
            problems.append(
                FieldViolation(
                    f"model_ids[{index}]",
                    "must be a model id (1-128 letters, digits and . _ : -)",
                )
            )
    if problems:
        raise invalid_argument(Reason.INVALID_FEED_FILTER, problems)
    return FeedRequest(
        after_seq=decode_cursor(request.cursor),
        user_ids=tuple(dict.fromkeys(request.user_ids)),
        model_ids=frozenset(request.model_ids),
    )

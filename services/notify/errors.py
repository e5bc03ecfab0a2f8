"""notify's error table: every failure notify's domain names, and the status a client (or
creation's relay) sees for it. The domain and the store raise these; only this module
(and the field checks in fields.py) knows gRPC. Reasons are contract: never reuse or
rename one."""

from __future__ import annotations

import grpc

from services.kit.errors import ApiError, DomainError
from services.kit.outages import DatabaseFailure


class Reason:
    # A Deliver request that no outbox row could have produced: empty, too large, or a
    # state without a job id, owner, version or status.
    INVALID_DELIVERY = "INVALID_DELIVERY"
    # RegisterDevice: a token, environment, bundle id or locale that cannot be one.
    INVALID_DEVICE = "INVALID_DEVICE"
    # A device id that is not a UUID.
    INVALID_DEVICE_ID = "INVALID_DEVICE_ID"
    # The device is not one of the caller's registered devices.
    DEVICE_NOT_FOUND = "DEVICE_NOT_FOUND"
    # RegisterLiveActivity / DeleteLiveActivity: a job id, device id, token or activity id
    # that cannot be one.
    INVALID_LIVE_ACTIVITY = "INVALID_LIVE_ACTIVITY"
    # No live token of the caller's is registered under that job and activity id.
    LIVE_ACTIVITY_NOT_FOUND = "LIVE_ACTIVITY_NOT_FOUND"
    # The job is not one of the caller's, or its owner deleted it (streams and tokens).
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    # WatchJob / WatchJobs: a job id, after_version or cursor that cannot be one.
    INVALID_JOB_ID = "INVALID_JOB_ID"
    INVALID_AFTER_VERSION = "INVALID_AFTER_VERSION"
    INVALID_CURSOR = "INVALID_CURSOR"
    # A WatchJobs or WatchAllJobs cursor the stream cannot resume from
    # (FAILED_PRECONDITION): resync.
    CURSOR_EXPIRED = "CURSOR_EXPIRED"
    # WatchAllJobs: a user or model id that cannot be one, or too many of them.
    INVALID_FEED_FILTER = "INVALID_FEED_FILTER"
    # NotifyAdminService: a field of an operator's request is wrong (a time range).
    INVALID_ADMIN_REQUEST = "INVALID_ADMIN_REQUEST"


class NotifyError(DomainError):
    """A failure of notify's domain; each subclass says how a client sees it."""


class _NotFound(NotifyError):
    """Unknown, or another user's (NOT_FOUND: no enumeration)."""

    reason = ""
    message = ""

    def to_api_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.NOT_FOUND, self.reason, self.message)


class DeviceNotFound(_NotFound):
    """The device is not one of the caller's live devices."""

    reason = Reason.DEVICE_NOT_FOUND
    message = "no such device"


class JobNotFound(_NotFound):
    """The job belongs to someone else, or its owner deleted it."""

    reason = Reason.JOB_NOT_FOUND
    message = "no such job"


class LiveActivityNotFound(_NotFound):
    """No live token of the caller's under that job and activity id."""

    reason = Reason.LIVE_ACTIVITY_NOT_FOUND
    message = "no such live activity"


class CursorExpired(NotifyError):
    """A WatchJobs or WatchAllJobs cursor the stream cannot resume from; ``why`` says
    which way."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.CURSOR_EXPIRED,
            f"{self.why}: watch afresh without a cursor and list the jobs",
        )


class DatabaseFailed(DatabaseFailure, NotifyError):
    """notify's database did not answer (refused, dropped, timed out, saturated) or a lock
    wait ended: UNAVAILABLE DATABASE_UNAVAILABLE, or ABORTED LOCK_TIMEOUT for contention,
    each with a retry hint (the kit's answer). A dependency failure, so the server logs it
    as one short throttled line, never a stack trace."""

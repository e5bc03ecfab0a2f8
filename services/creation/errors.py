"""creation's error table: every domain failure and the status a client sees for it.
Reasons are contract: never reuse or rename one."""

from __future__ import annotations

import grpc

from services.kit.errors import ApiError, DomainError, FieldViolation, invalid_argument
from services.kit.outages import DependencyUnavailable


class Reason:
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    DAILY_QUOTA_EXCEEDED = "DAILY_QUOTA_EXCEEDED"
    IN_FLIGHT_LIMIT_REACHED = "IN_FLIGHT_LIMIT_REACHED"
    INSUFFICIENT_POINTS = "INSUFFICIENT_POINTS"
    INVALID_JOB_REQUEST = "INVALID_JOB_REQUEST"
    MODEL_NOT_AVAILABLE = "MODEL_NOT_AVAILABLE"
    STYLE_NOT_AVAILABLE = "STYLE_NOT_AVAILABLE"
    STYLE_MODEL_MISMATCH = "STYLE_MODEL_MISMATCH"
    INPUT_ASSET_NOT_FOUND = "INPUT_ASSET_NOT_FOUND"
    INPUT_ASSET_NOT_READY = "INPUT_ASSET_NOT_READY"
    INPUT_ASSET_WRONG_PURPOSE = "INPUT_ASSET_WRONG_PURPOSE"
    MEDIA_UNAVAILABLE = "MEDIA_UNAVAILABLE"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    INVALID_JOB_ID = "INVALID_JOB_ID"
    JOB_ALREADY_FINISHED = "JOB_ALREADY_FINISHED"
    JOB_NOT_AWAITING_OPERATOR = "JOB_NOT_AWAITING_OPERATOR"
    INVALID_ADMIN_REQUEST = "INVALID_ADMIN_REQUEST"
    USER_BUSY = "USER_BUSY"
    INVALID_JOB_FILTER = "INVALID_JOB_FILTER"
    JOB_NOT_FINISHED = "JOB_NOT_FINISHED"
    MEDIA_KIND_NOT_SUPPORTED = "MEDIA_KIND_NOT_SUPPORTED"
    INVALID_WAIT_TIMEOUT = "INVALID_WAIT_TIMEOUT"
    INPUT_IMAGE_REQUIRED = "INPUT_IMAGE_REQUIRED"
    INPUT_IMAGE_REFUSED = "INPUT_IMAGE_REFUSED"
    INPUT_URL_REFUSED = "INPUT_URL_REFUSED"
    WEBHOOK_ENDPOINT_NOT_FOUND = "WEBHOOK_ENDPOINT_NOT_FOUND"
    WEBHOOK_DELIVERY_NOT_FOUND = "WEBHOOK_DELIVERY_NOT_FOUND"
    WEBHOOK_NOT_PERMITTED = "WEBHOOK_NOT_PERMITTED"
    WEBHOOK_SIGNING_KEY_MISSING = "WEBHOOK_SIGNING_KEY_MISSING"
    PROVIDER_REQUEST_NOT_FOUND = "PROVIDER_REQUEST_NOT_FOUND"
    PROVIDER_REQUEST_OF_ANOTHER_JOB = "PROVIDER_REQUEST_OF_ANOTHER_JOB"
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
    JOB_CANCEL_REQUESTED = "JOB_CANCEL_REQUESTED"


class CreationError(DomainError):
    """A failure of creation's domain; each subclass says how a client sees it."""


class IdempotencyKeyReused(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.ALREADY_EXISTS,
            Reason.IDEMPOTENCY_KEY_REUSED,
            "this idempotency key was already used for a different request",
        )


# Every number of points the API answers is an int32 (a JSON number).
MAX_POINTS = 2**31 - 1


class PointsPastLimit(CreationError):
    """A grant that would take the user's points (available plus reserved) past
    MAX_POINTS: refused, nothing granted."""

    def to_api_error(self) -> ApiError:
        return invalid_argument(
            Reason.INVALID_ADMIN_REQUEST,
            [FieldViolation("amount", f"would take the user's points past {MAX_POINTS}")],
        )


class DailyQuotaExceeded(CreationError):
    def __init__(self, quota: int, retry_after_seconds: float) -> None:
        super().__init__(quota)
        self.quota = quota
        self.retry_after_seconds = retry_after_seconds

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            Reason.DAILY_QUOTA_EXCEEDED,
            f"the daily limit of {self.quota} jobs is reached; it resets at 00:00 UTC",
            retry_after_seconds=self.retry_after_seconds,
            metadata={"quota": str(self.quota)},
        )


class InFlightLimitReached(CreationError):
    # A job usually finishes within this long; a hint, not a promise.
    RETRY_AFTER_SECONDS = 10.0

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            Reason.IN_FLIGHT_LIMIT_REACHED,
            f"at most {self.limit} {'job' if self.limit == 1 else 'jobs'} may be queued or"
            " running at once",
            retry_after_seconds=self.RETRY_AFTER_SECONDS,
            metadata={"limit": str(self.limit)},
        )


class InsufficientPoints(CreationError):
    def __init__(self, available: int, price: int) -> None:
        super().__init__(available, price)
        self.available = available
        self.price = price

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.INSUFFICIENT_POINTS,
            f"this model costs {self.price} points; {self.available} are available",
            metadata={"available": str(self.available), "price": str(self.price)},
        )


class InvalidRequest(CreationError):
    """A request field is wrong in a way only the database or another service could tell."""

    def __init__(self, reason: str, field: str, description: str) -> None:
        super().__init__(reason, field, description)
        self.reason = reason
        self.violation = FieldViolation(field, description)

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            self.reason,
            f"{self.violation.field}: {self.violation.description}",
            violations=[self.violation],
        )


class InputAssetNotFound(CreationError):
    def to_api_error(self) -> ApiError:
        # Unknown and someone else's look the same.
        return ApiError(
            grpc.StatusCode.NOT_FOUND,
            Reason.INPUT_ASSET_NOT_FOUND,
            "no such input asset",
            violations=[FieldViolation("input_asset_id", "no such asset")],
        )


class InputAssetNotReady(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.INPUT_ASSET_NOT_READY,
            "the input asset's upload is not complete",
            violations=[FieldViolation("input_asset_id", "complete the upload first")],
        )


class InputUrlRefused(CreationError):
    """media would not import SubmitJob's input_url; ``cause`` is media's word for why."""

    def __init__(self, cause: str, description: str) -> None:
        super().__init__(cause, description)
        self.cause = cause
        self.description = description

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.INPUT_URL_REFUSED,
            f"input_url: {self.description}",
            violations=[FieldViolation("input_url", self.description)],
            metadata={"cause": self.cause},
        )


class MediaUnavailable(DependencyUnavailable, CreationError):
    """media did not answer, or answered that it cannot serve now. The client sees
    MEDIA_UNAVAILABLE whatever media's own reason: it talks to creation, and its next step
    is the same (retry later); media's reason travels as ``cause`` for operators."""

    def __init__(self, cause: str = "", retry_after_seconds: float = 1.0) -> None:
        super().__init__(Reason.MEDIA_UNAVAILABLE, "media", cause, retry_after_seconds)


class UserBusy(CreationError):
    """Other requests of the same user hold or wait for the user's lock."""

    RETRY_AFTER_SECONDS = 1.0

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.ABORTED,
            Reason.USER_BUSY,
            "other requests of this user are in progress; try again",
            retry_after_seconds=self.RETRY_AFTER_SECONDS,
        )


class JobNotFound(CreationError):
    def to_api_error(self) -> ApiError:
        # The same answer for another user's job: ids are not to be probed.
        return ApiError(grpc.StatusCode.NOT_FOUND, Reason.JOB_NOT_FOUND, "no such job")


class JobAlreadyFinished(CreationError):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.JOB_ALREADY_FINISHED,
            f"the job has already finished ({self.status})",
            metadata={"status": self.status},
        )


class JobNotFinished(CreationError):
    """Only a finished job may be deleted: the worker or an operator still holds this one."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.JOB_NOT_FINISHED,
            f"only a finished job can be deleted (this one is {self.status}); cancel it first",
            metadata={"status": self.status},
        )


class JobCancelRequested(CreationError):
    """RESOLUTION_ADOPT on a job whose owner asked to cancel it while it waited."""

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.JOB_CANCEL_REQUESTED,
            "the job's owner asked to cancel it: resolve it with RESOLUTION_CANCEL",
        )


class ProviderRequestNotFound(CreationError):
    """RESOLUTION_ADOPT named a request the job's provider says it does not hold."""

    def __init__(self, provider_code: str) -> None:
        super().__init__(provider_code)
        self.provider_code = provider_code

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.PROVIDER_REQUEST_NOT_FOUND,
            f"provider {self.provider_code!r} holds no such request",
            violations=[FieldViolation("provider_request_id", "the provider has no such request")],
        )


class ProviderRequestOfAnotherJob(CreationError):
    """RESOLUTION_ADOPT named a request the provider holds for another job."""

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.PROVIDER_REQUEST_OF_ANOTHER_JOB,
            "the provider holds that request for another job",
            violations=[FieldViolation("provider_request_id", "belongs to another job")],
        )


class ProviderUnavailable(DependencyUnavailable, CreationError):
    """The job's provider did not answer a lookup RESOLUTION_ADOPT needed."""

    def __init__(self, provider_code: str, cause: str = "") -> None:
        super().__init__(Reason.PROVIDER_UNAVAILABLE, f"provider {provider_code}", cause)


class JobNotAwaitingOperator(CreationError):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.JOB_NOT_AWAITING_OPERATOR,
            f"only jobs that need attention can be resolved (this one is {self.status})",
        )


class WebhookEndpointNotFound(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.NOT_FOUND, Reason.WEBHOOK_ENDPOINT_NOT_FOUND, "no such webhook endpoint"
        )


class WebhookDeliveryNotFound(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.NOT_FOUND, Reason.WEBHOOK_DELIVERY_NOT_FOUND, "no such webhook delivery"
        )


class WebhookNotPermitted(CreationError):
    """SubmitJob's webhook from a caller that may not set one (a user-given URL is an
    SSRF door): only a backend identity with per_job_webhooks, acting for the user."""

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.WEBHOOK_NOT_PERMITTED,
            "webhook is honoured only for trusted service callers (per_job_webhooks)",
        )


class WebhookSigningKeyMissing(CreationError):
    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.WEBHOOK_SIGNING_KEY_MISSING,
            f"the identity {self.owner!r} has no webhook signing key yet: an operator makes"
            " one with RotateWebhookSecret (signing_owner)",
            metadata={"identity": self.owner},
        )

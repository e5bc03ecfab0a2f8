"""media's error table: every failure media's domain names, and the status a client or a
calling service sees for it. The domain raises these; only this module (and the field
layer) knows gRPC. Reasons are contract: never reuse or rename one."""

from __future__ import annotations

import grpc

from services.kit.errors import ApiError, DomainError, FieldViolation
from services.kit.outages import DatabaseFailure
from services.kit.sizes import byte_size


class Reason:
    # A request field is wrong (INVALID_ARGUMENT, with a field violation).
    INVALID_ASSET_ID = "INVALID_ASSET_ID"
    UPLOAD_PURPOSE_NOT_ALLOWED = "UPLOAD_PURPOSE_NOT_ALLOWED"
    INVALID_PURPOSE = "INVALID_PURPOSE"
    CONTENT_TYPE_NOT_ALLOWED = "CONTENT_TYPE_NOT_ALLOWED"
    INVALID_SIZE = "INVALID_SIZE"
    UPLOAD_TOO_LARGE = "UPLOAD_TOO_LARGE"
    INVALID_SHA256 = "INVALID_SHA256"
    INVALID_OWNER = "INVALID_OWNER"
    INVALID_PUT_STREAM = "INVALID_PUT_STREAM"
    # A batched call holds no item, or more than it takes.
    INVALID_BATCH = "INVALID_BATCH"
    # The bytes are not what they should be (INVALID_ARGUMENT); the object is removed.
    SIZE_MISMATCH = "SIZE_MISMATCH"
    HASH_MISMATCH = "HASH_MISMATCH"
    NOT_AN_IMAGE = "NOT_AN_IMAGE"
    IMAGE_TOO_LARGE = "IMAGE_TOO_LARGE"
    CONTENT_TYPE_MISMATCH = "CONTENT_TYPE_MISMATCH"
    # The asset is not in a state that allows the call (FAILED_PRECONDITION).
    OBJECT_MISSING = "OBJECT_MISSING"
    UPLOAD_ALREADY_COMPLETED = "UPLOAD_ALREADY_COMPLETED"
    UPLOAD_EXPIRED = "UPLOAD_EXPIRED"
    ASSET_DELETED = "ASSET_DELETED"
    ASSET_NOT_READY = "ASSET_NOT_READY"
    # The upload was replaced while it was being checked (ABORTED): complete again.
    UPLOAD_CHANGED = "UPLOAD_CHANGED"
    # PutAsset's idempotency key already stored other bytes (ALREADY_EXISTS).
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    INVALID_IDEMPOTENCY_KEY = "INVALID_IDEMPOTENCY_KEY"
    INVALID_IDEMPOTENCY_KEYS = "INVALID_IDEMPOTENCY_KEYS"
    # Unknown, or another user's (NOT_FOUND: no enumeration).
    ASSET_NOT_FOUND = "ASSET_NOT_FOUND"
    # A ready asset whose object storage lost (DATA_LOSS): an operator's problem.
    OBJECT_LOST = "OBJECT_LOST"
    # A dependency did not answer (UNAVAILABLE, with RetryInfo): try again later. The
    # database's reasons (DATABASE_UNAVAILABLE, LOCK_TIMEOUT) are the kit's (kit.outages).
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    # The local backend's signed URLs (HTTP answers of media's object listener).
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_MISMATCH = "SIGNATURE_MISMATCH"
    URL_EXPIRED = "URL_EXPIRED"
    NO_SUCH_OBJECT = "NO_SUCH_OBJECT"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    LENGTH_REQUIRED = "LENGTH_REQUIRED"
    TOO_LARGE = "TOO_LARGE"
    OBJECT_EXISTS = "OBJECT_EXISTS"
    INCOMPLETE_BODY = "INCOMPLETE_BODY"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    # ImportAsset would not fetch the URL, or what it answered failed a check.
    IMPORT_REFUSED = "IMPORT_REFUSED"


# Seconds a client should wait before retrying after a dependency failed to answer.
RETRY_AFTER_SECONDS = 1.0


class MediaError(DomainError):
    """A failure of media's domain; each subclass says how a client sees it."""


class AssetNotFound(MediaError):
    def to_api_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.NOT_FOUND, Reason.ASSET_NOT_FOUND, "no such asset")


class _WrongState(MediaError):
    """The asset's state does not allow the call (FAILED_PRECONDITION)."""

    reason = ""
    message = ""

    def to_api_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.FAILED_PRECONDITION, self.reason, self.message)


class AssetDeleted(_WrongState):
    reason = Reason.ASSET_DELETED
    message = "the asset was deleted"


class AssetNotReady(_WrongState):
    reason = Reason.ASSET_NOT_READY
    message = "the asset is not ready yet"


class UploadAlreadyCompleted(_WrongState):
    reason = Reason.UPLOAD_ALREADY_COMPLETED
    message = "the upload is already complete"


class UploadExpired(_WrongState):
    reason = Reason.UPLOAD_EXPIRED
    message = "the upload expired; start again with CreateUpload"


class StoringTookTooLong(_WrongState):
    """A server-side store outlived its upload's expiry and housekeeping removed it."""

    reason = Reason.UPLOAD_EXPIRED
    message = "storing took longer than allowed"


class ObjectMissing(_WrongState):
    reason = Reason.OBJECT_MISSING
    message = "no bytes were uploaded yet: PUT them to upload_url first"


class ReplayedUploadExpired(_WrongState):
    """A CreateUpload replay whose upload expired or was deleted: its request id is spent."""

    reason = Reason.UPLOAD_EXPIRED
    message = "the upload made for this request_id expired; start again with a new request_id"


class ReplayedUploadCompleted(MediaError):
    """A CreateUpload replay whose upload is already complete: the asset to use instead."""

    def __init__(self, asset_id: str) -> None:
        super().__init__(asset_id)
        self.asset_id = asset_id

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.UPLOAD_ALREADY_COMPLETED,
            "the upload made for this request_id is already complete",
            metadata={"asset_id": self.asset_id},
        )


class UploadChanged(MediaError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.ABORTED,
            Reason.UPLOAD_CHANGED,
            "the upload changed while it was checked; complete it again",
        )


class _KeyReused(MediaError):
    """An idempotency key that already made something else (ALREADY_EXISTS)."""

    message = ""

    def to_api_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.ALREADY_EXISTS, Reason.IDEMPOTENCY_KEY_REUSED, self.message)


class IdempotencyKeyReused(_KeyReused):
    """A keyed PutAsset whose key already holds different bytes (or purpose, or type)."""

    message = "the idempotency key already stored different content"


class UploadRequestReused(_KeyReused):
    """A CreateUpload whose request id already made an upload of another content type,
    size or hash."""

    message = "this request_id was already used for a different upload"


class StreamTooLarge(MediaError):
    """A server-side store streamed more bytes than an asset may have."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.max_bytes = max_bytes

    def to_api_error(self) -> ApiError:
        violation = FieldViolation(
            "chunk", f"the asset must be at most {byte_size(self.max_bytes)}"
        )
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.UPLOAD_TOO_LARGE,
            f"{violation.field}: {violation.description}",
            violations=[violation],
        )


class ObjectLost(MediaError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.DATA_LOSS,
            Reason.OBJECT_LOST,
            "the asset's bytes are missing from storage",
        )


class ContentRejected(MediaError):
    """Bytes failed a check; carries the reason the client will see."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def to_api_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.INVALID_ARGUMENT, self.reason, self.message)


class ImportRefused(MediaError):
    """ImportAsset refused a URL or what it answered; ``cause`` says why (a word of the
    fetch's, such as ADDRESS_NOT_ALLOWED, or the upload check's reason, such as
    NOT_AN_IMAGE)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(cause, message)
        self.cause = cause
        self.message = message

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.IMPORT_REFUSED,
            f"url: {self.message}",
            violations=[FieldViolation("url", self.message)],
            metadata={"cause": self.cause},
        )


class DatabaseFailed(DatabaseFailure, MediaError):
    """media's database did not answer, or a request gave way to another in a lock wait:
    answered as the kit answers it in every service (UNAVAILABLE DATABASE_UNAVAILABLE, or
    ABORTED LOCK_TIMEOUT for contention, each with RetryInfo)."""


class StorageUnavailable(MediaError):
    """The object store did not answer (unreachable, timed out, a server or disk error)."""

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.UNAVAILABLE,
            Reason.STORAGE_UNAVAILABLE,
            "media's object storage did not answer; try again",
            retry_after_seconds=RETRY_AFTER_SECONDS,
        )

"""media's error table: every reason a client or a calling service can see, and the status
code it travels with. Reasons are contract: never reuse or rename one."""

from __future__ import annotations

import grpc

from services.kit.errors import ApiError, FieldViolation, invalid_argument


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
    # Unknown, or another user's (NOT_FOUND: no enumeration).
    ASSET_NOT_FOUND = "ASSET_NOT_FOUND"
    # A ready asset whose object storage lost (DATA_LOSS): an operator's problem.
    OBJECT_LOST = "OBJECT_LOST"


def bad_field(reason: str, field: str, description: str) -> ApiError:
    return invalid_argument(reason, [FieldViolation(field, description)])


def rejected_content(reason: str, message: str) -> ApiError:
    """The stored bytes failed a check."""
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, reason, message)


def wrong_state(reason: str, message: str) -> ApiError:
    return ApiError(grpc.StatusCode.FAILED_PRECONDITION, reason, message)


def asset_not_found() -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, Reason.ASSET_NOT_FOUND, "no such asset")


def object_lost() -> ApiError:
    return ApiError(
        grpc.StatusCode.DATA_LOSS, Reason.OBJECT_LOST, "the asset's bytes are missing from storage"
    )


class ContentRejected(Exception):
    """Bytes failed a check; carries the reason the client will see."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def to_api_error(self) -> ApiError:
        return rejected_content(self.reason, self.message)

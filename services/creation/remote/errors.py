"""The remote worker protocol's failures and the status each answers. Reasons are
contract: never reuse or rename one.

A lease is refused without saying whether the job exists: the claim token is what names
the hold, so a caller without the token learns nothing about the job id it sent."""

from __future__ import annotations

import grpc

from services.creation.errors import CreationError
from services.kit.errors import ApiError


class Reason:
    # A claim's replay after its lease was released, cancelled, reaped or expired, or
    # first sent (request_time) longer ago than the retention of claims.
    CLAIM_REPLAY_EXPIRED = "CLAIM_REPLAY_EXPIRED"
    # A keyed call first sent (request_time) longer ago than the retention of answers.
    CALL_REPLAY_EXPIRED = "CALL_REPLAY_EXPIRED"
    # A new claim (new idempotency key) sent a claim token already used.
    CLAIM_TOKEN_REUSED = "CLAIM_TOKEN_REUSED"
    # No claim of this pool's worker holds the job with this token (or no such job).
    LEASE_TOKEN_INVALID = "LEASE_TOKEN_INVALID"
    # The token is another pool's.
    LEASE_POOL_MISMATCH = "LEASE_POOL_MISMATCH"
    # The token is right, the generation is not the one its claim answered.
    LEASE_GENERATION_STALE = "LEASE_GENERATION_STALE"
    # The lease ended (expired on the server's clock, reaped, released or finished).
    LEASE_EXPIRED = "LEASE_EXPIRED"
    # expected_version is not the job's version: heartbeat to learn why (a cancel).
    JOB_VERSION_MISMATCH = "JOB_VERSION_MISMATCH"
    # A request field is missing or malformed.
    INVALID_WORKER_REQUEST = "INVALID_WORKER_REQUEST"
    # media refused an output the worker sent.
    OUTPUT_REJECTED = "OUTPUT_REJECTED"


class ClaimReplayExpired(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.CLAIM_REPLAY_EXPIRED,
            "this claim's lease is no longer held; claim again with a new key and token",
        )


class CallReplayExpired(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            Reason.CALL_REPLAY_EXPIRED,
            "this call was first sent longer ago than its answer is kept; do not send it again",
        )


class ClaimTokenReused(CreationError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.CLAIM_TOKEN_REUSED,
            "a claim token is used for one claim only; generate a new one",
        )


_LEASE_MESSAGES = {
    Reason.LEASE_TOKEN_INVALID: "no lease of this worker matches the job and claim token",
    Reason.LEASE_POOL_MISMATCH: "the claim token belongs to another worker pool",
    Reason.LEASE_GENERATION_STALE: "the lease generation is not this claim's",
    Reason.LEASE_EXPIRED: "the lease has ended; stop working on the job",
}


class LeaseRefused(CreationError):
    """Every refusal of a lease is FAILED_PRECONDITION; the reason says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION, self.reason, _LEASE_MESSAGES[self.reason]
        )


class VersionMismatch(CreationError):
    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.ABORTED,
            Reason.JOB_VERSION_MISMATCH,
            "the job changed since the version sent; heartbeat and decide again",
            metadata={"version": str(self.version)},
        )


class OutputRejected(CreationError):
    """media refused an output (not an image of an accepted type, too large)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.OUTPUT_REJECTED,
            "media refused an output; report the attempt as failed (OUTPUT_REJECTED)",
        )

"""media's one error style: the domain raises MediaError subclasses and knows nothing of
gRPC; the error table maps each to the status it always had; only the field layer (and
the table itself) builds field violations."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest

from services.kit import outages
from services.kit.outages import Outage
from services.media import errors
from services.media.errors import MediaError, Reason

MEDIA = Path(errors.__file__).parent
# Where gRPC and the client's view belong: the servicers and their wire conversions, the
# field checks, the error table, the HTTP listener and its answers, and the assembly.
WIRE = {"servicer.py", "internal_servicer.py", "wire.py", "fields.py", "errors.py", "app.py"}
WIRE |= {"http.py", "http_answers.py"}
# Names that build a client's view of a failure.
API_NAMES = {"ApiError", "FieldViolation", "invalid_argument", "bad_field", "to_status"}


def domain_modules() -> list[Path]:
    return sorted(
        path
        for path in MEDIA.rglob("*.py")
        if path.name not in WIRE and "migrations" not in path.parts
    )


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names |= {alias.name for alias in node.names}
    return names


def test_the_domain_is_where_we_think_it_is() -> None:
    found = {path.relative_to(MEDIA).as_posix() for path in domain_modules()}
    assert {"assets.py", "store/assets.py", "housekeeping.py", "storage/s3.py"} <= found


@pytest.mark.parametrize("path", domain_modules(), ids=lambda p: p.relative_to(MEDIA).as_posix())
def test_domain_modules_never_import_grpc_or_build_api_errors(path: Path) -> None:
    names = imported_names(path)
    assert not {n for n in names if n == "grpc" or n.startswith(("grpc.", "grpc_"))}
    assert not names & API_NAMES
    assert "services.kit.errors" not in names


def test_only_the_field_layer_raises_field_violations() -> None:
    builders = {
        path.name
        for path in MEDIA.rglob("*.py")
        if {"FieldViolation", "invalid_argument", "bad_field"} & imported_names(path)
    }
    # The table's one violation (PutAsset's stream grew too large) keeps today's contract.
    assert builders == {"fields.py", "errors.py"}


SEEN = [
    (errors.AssetNotFound(), grpc.StatusCode.NOT_FOUND, Reason.ASSET_NOT_FOUND),
    (errors.AssetDeleted(), grpc.StatusCode.FAILED_PRECONDITION, Reason.ASSET_DELETED),
    (errors.AssetNotReady(), grpc.StatusCode.FAILED_PRECONDITION, Reason.ASSET_NOT_READY),
    (
        errors.UploadAlreadyCompleted(),
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.UPLOAD_ALREADY_COMPLETED,
    ),
    (errors.UploadExpired(), grpc.StatusCode.FAILED_PRECONDITION, Reason.UPLOAD_EXPIRED),
    (errors.StoringTookTooLong(), grpc.StatusCode.FAILED_PRECONDITION, Reason.UPLOAD_EXPIRED),
    (errors.ObjectMissing(), grpc.StatusCode.FAILED_PRECONDITION, Reason.OBJECT_MISSING),
    (errors.UploadChanged(), grpc.StatusCode.ABORTED, Reason.UPLOAD_CHANGED),
    (errors.StreamTooLarge(10), grpc.StatusCode.INVALID_ARGUMENT, Reason.UPLOAD_TOO_LARGE),
    (errors.ObjectLost(), grpc.StatusCode.DATA_LOSS, Reason.OBJECT_LOST),
    (
        errors.IdempotencyKeyReused(),
        grpc.StatusCode.ALREADY_EXISTS,
        Reason.IDEMPOTENCY_KEY_REUSED,
    ),
    (errors.UploadRequestReused(), grpc.StatusCode.ALREADY_EXISTS, Reason.IDEMPOTENCY_KEY_REUSED),
    (
        errors.ReplayedUploadCompleted("a"),
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.UPLOAD_ALREADY_COMPLETED,
    ),
    (errors.ReplayedUploadExpired(), grpc.StatusCode.FAILED_PRECONDITION, Reason.UPLOAD_EXPIRED),
    (
        errors.ContentRejected(Reason.NOT_AN_IMAGE, "no"),
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.NOT_AN_IMAGE,
    ),
    # The database's failures answer as in every service (kit.outages).
    (
        errors.DatabaseFailed(Outage("database", "unreachable")),
        grpc.StatusCode.UNAVAILABLE,
        outages.Reason.DATABASE_UNAVAILABLE,
    ),
    (
        errors.DatabaseFailed(Outage("database", "lock_timeout")),
        grpc.StatusCode.ABORTED,
        outages.Reason.LOCK_TIMEOUT,
    ),
    (errors.StorageUnavailable(), grpc.StatusCode.UNAVAILABLE, Reason.STORAGE_UNAVAILABLE),
    (
        errors.ImportRefused("ADDRESS_NOT_ALLOWED", "no"),
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.IMPORT_REFUSED,
    ),
]


@pytest.mark.parametrize(("failure", "code", "reason"), SEEN, ids=lambda v: type(v).__name__)
def test_each_domain_failure_keeps_its_status(
    failure: MediaError, code: grpc.StatusCode, reason: str
) -> None:
    api = failure.to_api_error()
    assert (api.code, api.reason) == (code, reason)
    # "Try again later" (or, after contention or a changed upload: ABORTED, "now") says
    # when: an HTTP client tells a retry-me 409 from a don't-retry one by retry-after.
    retried = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
    assert (api.retry_after_seconds is not None) == retried


def test_every_failure_class_is_in_the_table() -> None:
    def leaves(cls: type[MediaError]) -> set[type[MediaError]]:
        subclasses = set(cls.__subclasses__())
        return {c for c in subclasses if not c.__subclasses__()} | {
            leaf for c in subclasses for leaf in leaves(c)
        }

    assert leaves(MediaError) == {type(failure) for failure, _, _ in SEEN}

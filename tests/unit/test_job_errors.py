"""The mapping from a job's internal error code to what its owner is told (JobError's
reason and retryable; services/creation/job_errors.py): one JobErrorReason per row of the
providers' failure table, atelier's own codes beside them, every value reachable, every
code a writer records mapped, and the proto's comments agreeing with the flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atelier.creation.v1 import error_reason_pb2, job_pb2
from services.creation import convert
from services.creation.job_errors import (
    OWN_CODES,
    UNKNOWN_PROVIDER_CODE,
    JobErrorAnswer,
    error_columns,
    job_error,
)
from services.creation.providers.failures import FAILURES
from tests.unit.test_creation_convert import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "JOB_ERROR_REASON_"
REASONS = {
    name.removeprefix(PREFIX)
    for name, number in error_reason_pb2.JobErrorReason.items()
    if number != 0
}

# The table a client reads in error_reason.proto, written out: code -> (reason, retryable).
EXPECTED = {
    "TIMEOUT": ("PROVIDER_TIMEOUT", True),
    "UNAVAILABLE": ("PROVIDER_UNAVAILABLE", True),
    "RATE_LIMITED": ("PROVIDER_RATE_LIMITED", True),
    "AUTH_REJECTED": ("PROVIDER_AUTH_REJECTED", False),
    "TRANSIENT": ("PROVIDER_TRANSIENT_FAILURE", True),
    "REQUEST_UNKNOWN": ("PROVIDER_REQUEST_LOST", True),
    "CONTENT_REJECTED": ("PROVIDER_REJECTED_CONTENT", False),
    "INPUT_UNREADABLE": ("PROVIDER_REJECTED_INPUT", False),
    "INVALID_INPUT": ("PROVIDER_INVALID_REQUEST", False),
    "CANCELLED": ("PROVIDER_CANCELLED", True),
    "INTERNAL": ("PROVIDER_INTERNAL", True),
    "OUTPUT_EXPIRED": ("PROVIDER_OUTPUT_EXPIRED", True),
    "OUTPUT_INVALID": ("PROVIDER_OUTPUT_INVALID", False),
    "PROVIDER_BUG": ("PROVIDER_ERROR", True),
    "PROVIDER_NOT_CONFIGURED": ("MODEL_NOT_CONFIGURED", False),
    "MEDIA_UNAVAILABLE": ("INPUT_UNAVAILABLE", True),
    "OUTPUT_REJECTED": ("OUTPUT_REJECTED", True),
    "NO_OUTPUT": ("OUTPUT_MISSING", True),
    "LEASE_EXPIRED": ("WORKER_LOST", True),
    "OUTCOME_UNKNOWN": ("OUTCOME_UNKNOWN", False),
    "OPERATOR_FAILED": ("OPERATOR_FAILED", False),
}


@pytest.mark.parametrize("code", EXPECTED)
def test_each_code_maps_to_its_reason_and_flag(code: str) -> None:
    reason, retryable = EXPECTED[code]
    assert job_error(code) == JobErrorAnswer(reason, retryable)
    # The adapter's word matters only for codes no table knows.
    assert job_error(code, declared_retryable=not retryable) == JobErrorAnswer(reason, retryable)


def test_the_tables_are_exactly_the_expected_codes() -> None:
    assert set(FAILURES) | set(OWN_CODES) == set(EXPECTED)
    assert not set(FAILURES) & set(OWN_CODES)


def test_each_row_of_the_failure_table_has_a_reason_of_its_own() -> None:
    reasons = [failure.reason for failure in FAILURES.values()]
    assert len(set(reasons)) == len(reasons)
    assert all(reason.startswith("PROVIDER_") for reason in reasons)
    assert not set(reasons) & {reason for reason, _ in OWN_CODES.values()}


def test_every_reason_is_a_value_of_the_enum_and_every_value_is_reachable() -> None:
    mapped = {job_error(code).reason for code in EXPECTED} | {UNKNOWN_PROVIDER_CODE}
    assert mapped == REASONS


def test_a_code_no_table_knows_is_a_provider_error_as_its_adapter_declared() -> None:
    assert job_error("BACKEND_BUSY", declared_retryable=True) == JobErrorAnswer(
        "PROVIDER_ERROR", True
    )
    assert job_error("BACKEND_BAD") == JobErrorAnswer("PROVIDER_ERROR", False)


def test_the_over_limit_photo_is_a_rejected_input_not_worth_resubmitting() -> None:
    assert job_error("INPUT_UNREADABLE") == JobErrorAnswer("PROVIDER_REJECTED_INPUT", False)


def test_error_columns_hold_the_code_beside_what_the_owner_is_told() -> None:
    assert error_columns("LEASE_EXPIRED") == {
        "error_code": "LEASE_EXPIRED",
        "error_reason": "WORKER_LOST",
        "error_retryable": True,
    }


# Codes recorded as literals: AttemptFailed("X", ...), Failed("X", ...),
# ProviderError("X", ...), error_columns("X"), _error_literal("X").
_RECORDED = re.compile(
    r"\b(?:AttemptFailed|Failed|ProviderError|error_columns|_error_literal)\(\s*\"([A-Z_]+)\""
)


def test_every_code_the_services_record_has_a_reason() -> None:
    found = {
        code
        for path in (ROOT / "services" / "creation").rglob("*.py")
        if "migrations" not in path.parts
        for code in _RECORDED.findall(path.read_text())
    }
    assert {"INPUT_UNREADABLE", "OUTCOME_UNKNOWN", "OPERATOR_FAILED", "NO_OUTPUT"} <= found
    assert found - set(EXPECTED) == set()


def _migration_reasons() -> dict[str, tuple[str, bool]]:
    source = (ROOT / "services/creation/migrations/versions/0022_typed_job_errors.py").read_text()
    namespace: dict[str, object] = {}
    block = source[source.index("REASONS = {") : source.index("}\n", source.index("REASONS = {"))]
    exec(block + "}", namespace)  # noqa: S102 - our own migration's literal
    reasons = namespace["REASONS"]
    assert isinstance(reasons, dict)
    return reasons


def test_migration_0022_backfilled_each_code_as_it_is_mapped_now() -> None:
    """A code never changes meaning: what 0022 wrote for old rows is what a writer writes."""
    for code, (reason, retryable) in _migration_reasons().items():
        assert job_error(code) == JobErrorAnswer(reason, retryable), code


def _value_comments() -> dict[str, str]:
    """Each JobErrorReason value's comment in error_reason.proto, by name."""
    source = (ROOT / "protos/atelier/creation/v1/error_reason.proto").read_text()
    body = source[source.index("enum JobErrorReason {") :]
    found: dict[str, str] = {}
    comment: list[str] = []
    for line in body.splitlines()[1:]:
        text = line.strip()
        if text.startswith("//"):
            comment.append(text.removeprefix("//").strip())
        elif text.startswith(PREFIX):
            found[text.split()[0].removeprefix(PREFIX)] = " ".join(comment)
            comment = []
        elif not text:
            comment = []
    return found


def test_the_protos_comments_say_what_to_do_as_the_flags_do() -> None:
    comments = _value_comments()
    assert set(comments) == REASONS | {"UNSPECIFIED"}
    for code, (reason, retryable) in EXPECTED.items():
        if reason == UNKNOWN_PROVIDER_CODE:
            assert "retryable says" in comments[reason]
        elif retryable:
            assert "retryable:" in comments[reason] and "Not retryable" not in comments[reason]
        else:
            assert "Not retryable" in comments[reason], code
    for failure in FAILURES.values():
        assert comments[failure.reason].startswith(f"{failure.code}:"), failure.code


def test_the_owner_sees_the_reason_and_flag_never_the_code() -> None:
    error = convert.job_message(VARIANTS["failed for good"]).error
    assert error == job_pb2.JobError(
        reason=error_reason_pb2.JOB_ERROR_REASON_PROVIDER_REJECTED_INPUT,
        retryable=False,
        message="too many pixels",
    )
    assert "code" not in job_pb2.JobError.DESCRIPTOR.fields_by_name
    attention = convert.job_message(VARIANTS["needs attention, no message"]).error
    assert (attention.reason, attention.retryable) == (
        error_reason_pb2.JOB_ERROR_REASON_OUTCOME_UNKNOWN,
        False,
    )

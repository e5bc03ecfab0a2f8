import base64
import json
import logging

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.creation.errors import InFlightLimitReached
from services.kit.errors import (
    MAX_DESCRIPTION_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_VIOLATIONS,
    STATUS_DETAILS_KEY,
    ApiError,
    FieldViolation,
    invalid_argument,
)
from services.kit.logging import JsonFormatter, get_logger


def unpack(status: status_pb2.Status) -> dict[str, object]:
    found: dict[str, object] = {}
    for detail in status.details:
        for kind in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.RetryInfo,
        ):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                found[kind.__name__] = message
    return found


def test_error_carries_reason_violations_and_retry() -> None:
    error = ApiError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "DAILY_QUOTA_EXCEEDED",
        "daily quota reached",
        violations=[FieldViolation("width", "too big")],
        retry_after_seconds=12.2,
    )
    status = error.to_status()
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    details = unpack(status)
    info = details["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain) == ("DAILY_QUOTA_EXCEEDED", "atelier.dev")
    bad = details["BadRequest"]
    assert isinstance(bad, error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == "width"
    retry = details["RetryInfo"]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert retry.retry_delay.seconds == 13
    assert error.initial_metadata() == (("retry-after", "13"),)


def test_invalid_argument_summarises_fields() -> None:
    error = invalid_argument("INVALID_SIZE", [FieldViolation("width", "must be 64..2048")])
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "width" in error.message
    assert error.initial_metadata() == ()


def test_logs_are_json_with_action_and_fields_and_no_secrets() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "job_claimed", None, None)
    record.fields = {"job_id": "j1", "service_token": "abc", "authorization": "Bearer x"}
    line = json.loads(JsonFormatter("creation").format(record))
    assert line["action"] == "job_claimed"
    assert line["service"] == "creation"
    assert line["job_id"] == "j1"
    assert line["service_token"] == "[redacted]"
    assert line["authorization"] == "[redacted]"


def test_event_logger_passes_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        get_logger("atelier.test").info("lease_lost", job_id="j2")
    assert caplog.records[-1].getMessage() == "lease_lost"
    assert caplog.records[-1].fields == {"job_id": "j2"}  # type: ignore[attr-defined]


def test_a_debug_line_is_written_only_when_debug_is_on(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("atelier.test.debug")
    with caplog.at_level(logging.INFO):
        log.debug("attempt_ended", job_id="j3")
    assert [r for r in caplog.records if r.name == "atelier.test.debug"] == []
    with caplog.at_level(logging.DEBUG):
        log.debug("attempt_ended", job_id="j3")
    [record] = [r for r in caplog.records if r.name == "atelier.test.debug"]
    assert (record.levelno, record.fields) == (logging.DEBUG, {"job_id": "j3"})  # type: ignore[attr-defined]


def test_a_disabled_line_makes_no_record(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = get_logger("atelier.test.disabled")

    def made(*args: object, **kwargs: object) -> None:
        raise AssertionError("a record was made for a disabled level")

    # The level check comes first: no record is built, nothing is formatted.
    monkeypatch.setattr(logging.getLogger("atelier.test.disabled"), "_log", made)
    with caplog.at_level(logging.WARNING):
        log.debug("attempt_ended", job_id="j4")
        log.info("attempt_ended", job_id="j4")


def test_a_long_violation_list_is_capped_with_a_count_of_the_rest() -> None:
    violations = [FieldViolation(f"outputs[{i}].sha256", "must be hex") for i in range(500)]
    error = invalid_argument("INVALID_WORKER_REQUEST", violations)
    bad = unpack(error.to_status())["BadRequest"]
    assert isinstance(bad, error_details_pb2.BadRequest)
    shown = [(v.field, v.description) for v in bad.field_violations]
    assert shown[:MAX_VIOLATIONS] == [(v.field, v.description) for v in violations[:20]]
    assert shown[MAX_VIOLATIONS:] == [("", "and 480 more violations not shown")]
    assert {v.reason for v in bad.field_violations} == {"INVALID_WORKER_REQUEST"}
    assert error.message.endswith("…") and "outputs[0].sha256: must be hex" in error.message


def test_a_short_violation_list_is_sent_as_it_is() -> None:
    violations = [FieldViolation("width", "must be 64..2048"), FieldViolation("height", "too")]
    bad = unpack(invalid_argument("INVALID_SIZE", violations).to_status())["BadRequest"]
    assert isinstance(bad, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("width", "must be 64..2048"),
        ("height", "too"),
    ]


def wire_bytes(error: ApiError) -> int:
    """What the error costs in trailers: grpc-message percent-encodes every byte outside
    printable ASCII; grpc-status-details-bin is base64."""
    message = sum(1 if 0x20 <= b < 0x7F and b != ord("%") else 3 for b in error.message.encode())
    details = len(base64.b64encode(error.to_status().SerializeToString()))
    return len("grpc-message") + message + len(STATUS_DETAILS_KEY) + details


def test_any_error_stays_well_under_the_metadata_limit() -> None:
    """The worst case: many violations, each field and description long and of 4-byte
    characters, and a long message of them."""
    huge = "𝄞" * 5000
    many = [FieldViolation(huge, huge) for _ in range(1000)]
    for error in (
        invalid_argument("INVALID_WORKER_REQUEST", many),
        ApiError(grpc.StatusCode.FAILED_PRECONDITION, "SOME_REASON", huge, violations=many),
    ):
        assert wire_bytes(error) < 6 * 1024
        assert len(error.message.encode()) <= MAX_MESSAGE_BYTES
        bad = unpack(error.to_status())["BadRequest"]
        assert isinstance(bad, error_details_pb2.BadRequest)
        assert bad.field_violations[0].field.endswith("…")
        assert len(bad.field_violations[0].description.encode()) <= MAX_DESCRIPTION_BYTES
        # What fits, then the count of what did not.
        hidden = bad.field_violations[-1].description
        assert hidden == f"and {1000 - len(bad.field_violations) + 1} more violations not shown"


@pytest.mark.parametrize(
    ("limit", "said"),
    [(1, "at most 1 job may be queued"), (3, "at most 3 jobs may be queued")],
)
def test_the_in_flight_limit_is_said_in_good_english(limit: int, said: str) -> None:
    assert said in InFlightLimitReached(limit).to_api_error().message


def test_aborted_always_says_when_to_retry_and_already_exists_never() -> None:
    """Both are HTTP 409 through the edge: `retry-after` alone tells "send it again" (ABORTED:
    USER_BUSY, LOCK_TIMEOUT, UPLOAD_CHANGED) from "never" (ALREADY_EXISTS)."""
    changed = ApiError(grpc.StatusCode.ABORTED, "UPLOAD_CHANGED", "complete it again")
    assert changed.initial_metadata() == (("retry-after", "0"),)
    busy = ApiError(grpc.StatusCode.ABORTED, "USER_BUSY", "busy", retry_after_seconds=1.0)
    assert busy.initial_metadata() == (("retry-after", "1"),)
    reused = ApiError(grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED", "used")
    assert reused.initial_metadata() == ()
    assert not any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in reused.to_status().details)

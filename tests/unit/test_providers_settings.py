"""The stub provider's settings: defaults, fault specs and crash points, all bounded."""

from __future__ import annotations

import pytest

from services.creation.settings import CreationSettings, StubFault
from services.kit.settings import SettingsError


def test_stub_defaults() -> None:
    stub = CreationSettings.from_env({}).stub
    assert stub.duration_seconds == 3.0
    assert stub.latency_seconds == 0.0
    assert stub.state_dir == "./var/stub"
    assert stub.ledger_path is None and stub.crash_at is None and stub.faults == ()


def test_stub_values_are_read() -> None:
    stub = CreationSettings.from_env(
        {
            "ATELIER_STUB_DURATION": "0",
            "ATELIER_STUB_LATENCY": "0.25",
            "ATELIER_STUB_FAIL": "submit:UNAVAILABLE, poll:CONTENT_REJECTED",
            "ATELIER_STUB_FAIL_TIMES": "2",
            "ATELIER_STUB_CRASH_AT": "after_submit",
            "ATELIER_STUB_LEDGER": "/tmp/ledger.txt",
            "ATELIER_STUB_STATE_DIR": "/tmp/stub",
        }
    ).stub
    assert stub.duration_seconds == 0 and stub.latency_seconds == 0.25
    assert stub.faults == (
        StubFault("submit", "UNAVAILABLE", 2),
        StubFault("poll", "CONTENT_REJECTED", 2),
    )
    assert stub.crash_at == "after_submit"
    assert stub.ledger_path == "/tmp/ledger.txt" and stub.state_dir == "/tmp/stub"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ATELIER_STUB_FAIL", "submit:NOPE", "ATELIER_STUB_FAIL must be call:CODE"),
        ("ATELIER_STUB_FAIL", "render:TIMEOUT", "ATELIER_STUB_FAIL must be call:CODE"),
        ("ATELIER_STUB_FAIL", "UNAVAILABLE", "ATELIER_STUB_FAIL must be call:CODE"),
        ("ATELIER_STUB_CRASH_AT", "midway", "ATELIER_STUB_CRASH_AT must be one of before_submit"),
        ("ATELIER_STUB_DURATION", "-1", "ATELIER_STUB_DURATION must be between 0 and 3600"),
        ("ATELIER_STUB_LATENCY", "61", "ATELIER_STUB_LATENCY must be between 0 and 60"),
        ("ATELIER_STUB_FAIL_TIMES", "-1", "ATELIER_STUB_FAIL_TIMES must be between 0"),
    ],
)
def test_bad_stub_values_are_refused_by_name(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        CreationSettings.from_env({variable: value})

"""The deadlines every database wait and every shutdown step get, from ATELIER_*."""

from __future__ import annotations

import pytest

from services.kit.settings import CommonSettings, DatabaseSettings, EnvReader, SettingsError


def _common(environ: dict[str, str]) -> CommonSettings:
    reader = EnvReader(environ)
    settings = CommonSettings.read(reader)
    reader.finish()
    return settings


def test_defaults_bound_every_wait() -> None:
    settings = _common({})
    database = settings.database
    assert database == DatabaseSettings()
    assert 0 < database.lock_timeout_seconds <= database.statement_timeout_seconds
    assert database.pool_timeout_seconds > 0 and database.connect_timeout_seconds > 0
    # Health follows the database within about three seconds.
    assert settings.readiness_period_seconds + settings.readiness_timeout_seconds <= 3
    assert settings.drain_window_seconds == 0  # dev: stop at once
    # A call answers within 3 s, and past every single wait's own bound.
    assert settings.call_deadline_seconds == 3
    assert settings.call_deadline_seconds > database.statement_timeout_seconds


def test_the_call_deadline_is_read() -> None:
    assert _common({"ATELIER_CALL_DEADLINE": "1.5"}).call_deadline_seconds == 1.5


def test_prod_keeps_serving_a_while_after_sigterm() -> None:
    environ = {
        "ATELIER_ENV": "prod",
        "ATELIER_JWT_SECRET": "x" * 40,
        "ATELIER_SERVICE_TOKEN": "y" * 40,
    }
    assert _common(environ).drain_window_seconds == 5
    assert _common({**environ, "ATELIER_DRAIN_WINDOW": "12"}).drain_window_seconds == 12


def test_database_deadlines_are_read() -> None:
    database = _common(
        {
            "ATELIER_DB_STATEMENT_TIMEOUT": "4",
            "ATELIER_DB_LOCK_TIMEOUT": "0.5",
            "ATELIER_DB_POOL_TIMEOUT": "3",
            "ATELIER_DB_CONNECT_TIMEOUT": "1",
            "ATELIER_DB_POOL_SIZE": "7",
        }
    ).database
    assert database == DatabaseSettings(4, 0.5, 3, 1, 7)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ATELIER_DB_STATEMENT_TIMEOUT", "0", "ATELIER_DB_STATEMENT_TIMEOUT must be between"),
        ("ATELIER_DB_LOCK_TIMEOUT", "5", "ATELIER_DB_LOCK_TIMEOUT must not exceed"),
        ("ATELIER_DB_POOL_TIMEOUT", "never", "ATELIER_DB_POOL_TIMEOUT must be a number"),
        ("ATELIER_DB_POOL_SIZE", "0", "ATELIER_DB_POOL_SIZE must be between"),
        ("ATELIER_DRAIN_WINDOW", "-1", "ATELIER_DRAIN_WINDOW must be between"),
        ("ATELIER_READINESS_TIMEOUT", "0", "ATELIER_READINESS_TIMEOUT must be between"),
        ("ATELIER_CALL_DEADLINE", "0", "ATELIER_CALL_DEADLINE must be between"),
        ("ATELIER_CALL_DEADLINE", "soon", "ATELIER_CALL_DEADLINE must be a number"),
    ],
)
def test_bad_values_are_named(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        _common({variable: value})

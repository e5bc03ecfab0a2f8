"""The outbox relay's settings: defaults, values read, and bounds that name the variable."""

from __future__ import annotations

import pytest

from services.creation.relay.pruning import remote_prunings
from services.creation.settings import CreationSettings, RelaySettings
from services.kit.client_times import CLIENT_CLOCK_SKEW
from services.kit.settings import SettingsError


def test_defaults() -> None:
    assert CreationSettings.from_env({}).relay == RelaySettings()
    relay = RelaySettings()
    assert (relay.batch, relay.poll_seconds, relay.fault) == (200, 1, None)
    assert (relay.backoff_base_seconds, relay.backoff_max_seconds) == (0.1, 2)
    assert (relay.retention_seconds, relay.prune_period_seconds) == (86400, 60)
    assert relay.round_spacing_seconds == 0.05


def test_the_round_spacing_is_read_and_bounded() -> None:
    read = CreationSettings.from_env({"ATELIER_RELAY_ROUND_SPACING": "0"}).relay
    assert read.round_spacing_seconds == 0
    with pytest.raises(SettingsError, match="ATELIER_RELAY_ROUND_SPACING"):
        CreationSettings.from_env({"ATELIER_RELAY_ROUND_SPACING": "2"})


def test_values_are_read() -> None:
    relay = CreationSettings.from_env(
        {
            "ATELIER_RELAY_BATCH": "50",
            "ATELIER_RELAY_POLL": "0.5",
            "ATELIER_RELAY_BACKOFF_BASE": "0.2",
            "ATELIER_RELAY_BACKOFF_MAX": "10",
            "ATELIER_RELAY_DELIVER_TIMEOUT": "3",
            "ATELIER_RELAY_RETENTION": "0",
            "ATELIER_RELAY_PRUNE_PERIOD": "5",
            "ATELIER_RELAY_FAULT": "duplicate_reversed",
        }
    ).relay
    assert relay == RelaySettings(50, 0.5, 0.2, 10, 3, 0, 5, "duplicate_reversed")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ATELIER_RELAY_BATCH", "0"),
        ("ATELIER_RELAY_BATCH", "1001"),
        ("ATELIER_RELAY_POLL", "0"),
        ("ATELIER_RELAY_BACKOFF_MAX", "1000"),
        ("ATELIER_RELAY_DELIVER_TIMEOUT", "0"),
        ("ATELIER_RELAY_RETENTION", "-1"),
        ("ATELIER_RELAY_PRUNE_PERIOD", "0"),
        ("ATELIER_RELAY_FAULT", "drop_everything"),
    ],
)
def test_out_of_bounds_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        CreationSettings.from_env({variable: value})


def test_the_backoff_base_must_not_exceed_its_maximum() -> None:
    with pytest.raises(SettingsError, match="ATELIER_RELAY_BACKOFF_BASE"):
        CreationSettings.from_env(
            {"ATELIER_RELAY_BACKOFF_BASE": "5", "ATELIER_RELAY_BACKOFF_MAX": "1"}
        )


def test_remote_rows_are_kept_past_the_retention_by_the_clients_clock_skew() -> None:
    """A replay is answered until its request_time (up to the skew ahead of the server's
    clock) is older than the retention: its row must still be there until then."""
    kept = {p.name: p.retention_seconds for p in remote_prunings(7 * 86400)}
    skew = CLIENT_CLOCK_SKEW.total_seconds()
    assert kept == {"remote_claims": 7 * 86400 + skew, "remote_calls": 7 * 86400 + skew}

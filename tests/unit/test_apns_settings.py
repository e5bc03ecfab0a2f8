"""ATELIER_APNS_*: off by default, complete when on, the JWT refresh within Apple's limits,
the lease longer than a send and its retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.kit.settings import SettingsError
from services.notify.apns.settings import PRODUCTION_URL, SANDBOX_URL, ApnsSettings
from services.notify.settings import NotifySettings


def test_off_by_default_with_apples_hosts() -> None:
    settings = ApnsSettings.from_env({})
    assert not settings.enabled
    assert settings.base_url("production") == PRODUCTION_URL
    assert settings.base_url("sandbox") == SANDBOX_URL
    assert 1200 <= settings.token_refresh_seconds <= 3600
    assert not NotifySettings.from_env({}).apns.enabled


def test_enabled_needs_key_ids_and_bundle() -> None:
    with pytest.raises(SettingsError) as raised:
        ApnsSettings.from_env({"ATELIER_APNS_ENABLED": "true"})
    for name in ("KEY_PATH", "KEY_ID", "TEAM_ID", "BUNDLE_ID"):
        assert f"ATELIER_APNS_{name} is required" in str(raised.value)


@pytest.mark.parametrize("seconds", ["600", "3601"])
def test_the_jwt_refresh_stays_within_apples_limits(seconds: str) -> None:
    with pytest.raises(SettingsError, match="ATELIER_APNS_TOKEN_REFRESH"):
        ApnsSettings.from_env({"ATELIER_APNS_TOKEN_REFRESH": seconds})


def test_the_lease_must_outlast_a_send_and_its_retry() -> None:
    with pytest.raises(SettingsError, match="ATELIER_APNS_LEASE must exceed twice"):
        ApnsSettings.from_env({"ATELIER_APNS_LEASE": "15", "ATELIER_APNS_REQUEST_TIMEOUT": "10"})


def test_hosts_are_overridable_for_a_test_peer() -> None:
    settings = ApnsSettings.from_env(
        {"ATELIER_APNS_SANDBOX_URL": "https://127.0.0.1:2197/", "ATELIER_APNS_CA_FILE": "/ca.pem"}
    )
    assert settings.base_url("sandbox") == "https://127.0.0.1:2197"
    assert settings.base_url("production") == PRODUCTION_URL


def test_notify_will_not_start_with_a_key_that_is_not_p256(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from sqlalchemy.ext.asyncio import create_async_engine

    from services.notify.apns.assemble import build_sender

    path = tmp_path / "p384.p8"
    key = ec.generate_private_key(ec.SECP384R1())
    content = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(content)
    settings = ApnsSettings(
        enabled=True, key_path=str(path), key_id="ABC123DEFG", team_id="TEAM123456", bundle_id="a.b"
    )
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    with pytest.raises(SettingsError, match=r"ATELIER_APNS_KEY_PATH: .* not P-256") as raised:
        build_sender(settings, engine)
    assert content.decode().splitlines()[1] not in str(raised.value)

"""media's settings: safe defaults, bounds, and rules that span several values."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.kit.settings import SettingsError
from services.media.settings import DEV_URL_SECRET, MediaSettings


def test_defaults_run_locally() -> None:
    settings = MediaSettings.from_env({})
    assert settings.storage_backend == "local"
    assert settings.local_dir == Path("var/media").resolve()
    assert settings.local_dir.is_absolute()
    assert settings.public_base_url == "http://127.0.0.1:8080"
    assert settings.http_port == 50072
    assert settings.url_secret == DEV_URL_SECRET
    assert settings.max_upload_bytes == 20 * 1024 * 1024
    assert settings.chunk_bytes == 256 * 1024
    assert settings.upload_url_ttl_seconds == 900
    assert settings.download_url_ttl_seconds == 300
    assert settings.download_url_window_seconds == 3600


def test_a_download_url_window_and_ttl_fit_in_a_signed_urls_life() -> None:
    week = 7 * 24 * 3600
    fits = MediaSettings.from_env(
        {
            "ATELIER_MEDIA_DOWNLOAD_URL_WINDOW": str(week - 300),
            "ATELIER_MEDIA_DOWNLOAD_URL_TTL": "300",
        }
    )
    assert fits.download_url_window_seconds == week - 300
    with pytest.raises(SettingsError, match="ATELIER_MEDIA_DOWNLOAD_URL_WINDOW plus"):
        MediaSettings.from_env({"ATELIER_MEDIA_DOWNLOAD_URL_WINDOW": str(week - 299)})


def test_s3_settings_are_read() -> None:
    settings = MediaSettings.from_env(
        {
            "ATELIER_MEDIA_STORAGE": "s3",
            "ATELIER_MEDIA_S3_ENDPOINT": "http://minio:9000",
            "ATELIER_MEDIA_S3_PUBLIC_ENDPOINT": "https://files.example.com",
            "ATELIER_MEDIA_S3_BUCKET": "atelier",
            "ATELIER_MEDIA_S3_REGION": "eu-west-1",
            "ATELIER_MEDIA_S3_ACCESS_KEY_ID": "minio",
            "ATELIER_MEDIA_S3_SECRET_ACCESS_KEY": "minio-secret",
            "ATELIER_MEDIA_S3_PATH_STYLE": "true",
        }
    )
    assert settings.s3.endpoint_url == "http://minio:9000"
    assert settings.s3.public_endpoint_url == "https://files.example.com"
    assert settings.s3.bucket == "atelier" and settings.s3.region == "eu-west-1"
    assert settings.s3.path_style is True


def test_a_relative_local_dir_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = MediaSettings.from_env({"ATELIER_MEDIA_LOCAL_DIR": "objects"})
    assert settings.local_dir == tmp_path / "objects"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ATELIER_MEDIA_STORAGE", "gcs", "ATELIER_MEDIA_STORAGE must be one of local, s3"),
        (
            "ATELIER_MAX_UPLOAD_BYTES",
            "10",
            r"ATELIER_MAX_UPLOAD_BYTES must be between 1 KiB and 512 MiB \(got 10 bytes\)",
        ),
        ("ATELIER_MEDIA_CHUNK_BYTES", str(8 * 1024 * 1024), "ATELIER_MEDIA_CHUNK_BYTES must be"),
        ("ATELIER_MEDIA_MAX_IMAGE_PIXELS", "100000000", "ATELIER_MEDIA_MAX_IMAGE_PIXELS must be"),
        ("ATELIER_MEDIA_UPLOAD_URL_TTL", "1", "ATELIER_MEDIA_UPLOAD_URL_TTL must be between"),
        ("ATELIER_MEDIA_DOWNLOAD_URL_TTL", "999999999", "ATELIER_MEDIA_DOWNLOAD_URL_TTL must be"),
        ("ATELIER_MEDIA_DOWNLOAD_URL_WINDOW", "0", "ATELIER_MEDIA_DOWNLOAD_URL_WINDOW must be"),
        ("ATELIER_MEDIA_HTTP_PORT", "0", "ATELIER_MEDIA_HTTP_PORT must be between"),
        ("ATELIER_MEDIA_HOUSEKEEPING_PERIOD", "0", "ATELIER_MEDIA_HOUSEKEEPING_PERIOD must be"),
        ("ATELIER_MEDIA_PUBLIC_BASE_URL", "edge:8080", "must start with http:// or https://"),
        ("ATELIER_MEDIA_S3_PATH_STYLE", "yes", "ATELIER_MEDIA_S3_PATH_STYLE must be one of"),
        ("ATELIER_MEDIA_URL_SECRET", "short", "ATELIER_MEDIA_URL_SECRET must be at least 32"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        MediaSettings.from_env({variable: value})


def test_s3_needs_a_bucket_and_both_keys_or_neither() -> None:
    with pytest.raises(SettingsError) as caught:
        MediaSettings.from_env(
            {"ATELIER_MEDIA_STORAGE": "s3", "ATELIER_MEDIA_S3_ACCESS_KEY_ID": "only-the-id"}
        )
    assert "ATELIER_MEDIA_S3_BUCKET must be set for s3" in str(caught.value)
    assert "ATELIER_MEDIA_S3_ACCESS_KEY_ID and ATELIER_MEDIA_S3_SECRET_ACCESS_KEY" in str(
        caught.value
    )
    # No keys at all: the default credential chain (instance role, environment) applies.
    assert (
        MediaSettings.from_env(
            {"ATELIER_MEDIA_STORAGE": "s3", "ATELIER_MEDIA_S3_BUCKET": "b"}
        ).s3.access_key_id
        == ""
    )


PROD = {"ATELIER_ENV": "prod", "ATELIER_JWT_SECRET": "j" * 40, "ATELIER_SERVICE_TOKEN": "s" * 40}


def test_prod_with_local_storage_needs_its_own_url_secret() -> None:
    with pytest.raises(SettingsError, match="ATELIER_MEDIA_URL_SECRET must be set in prod"):
        MediaSettings.from_env(PROD)
    assert MediaSettings.from_env({**PROD, "ATELIER_MEDIA_URL_SECRET": "u" * 40}).url_secret == (
        "u" * 40
    )
    assert (
        MediaSettings.from_env(
            {**PROD, "ATELIER_MEDIA_STORAGE": "s3", "ATELIER_MEDIA_S3_BUCKET": "b"}
        ).storage_backend
        == "s3"
    )


def test_secrets_never_appear_in_messages() -> None:
    with pytest.raises(SettingsError) as caught:
        MediaSettings.from_env(
            {"ATELIER_MEDIA_URL_SECRET": "hunter2", "ATELIER_MEDIA_S3_SECRET_ACCESS_KEY": "pw1"}
        )
    assert "hunter2" not in str(caught.value) and "pw1" not in str(caught.value)


def test_abandoned_writes_age_an_hour_by_default_and_never_less_than_a_minute() -> None:
    assert MediaSettings.from_env({}).abandoned_write_age_seconds == 3600
    given = MediaSettings.from_env({"ATELIER_MEDIA_ABANDONED_WRITE_AGE": "900"})
    assert given.abandoned_write_age_seconds == 900
    # Shorter would risk removing a write still in progress.
    with pytest.raises(SettingsError, match="ATELIER_MEDIA_ABANDONED_WRITE_AGE must be between"):
        MediaSettings.from_env({"ATELIER_MEDIA_ABANDONED_WRITE_AGE": "5"})


def test_imports_fetch_public_addresses_only_unless_a_test_says_otherwise() -> None:
    settings = MediaSettings.from_env({})
    assert (settings.import_timeout_seconds, settings.import_allowed_networks) == (10, ())
    allowed = MediaSettings.from_env(
        {"ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS": "127.0.0.1/32, ::1/128"}
    )
    assert allowed.import_allowed_networks == ("127.0.0.1/32", "::1/128")
    with pytest.raises(SettingsError, match="ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS"):
        MediaSettings.from_env({"ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS": "not-a-network"})
    prod = {**PROD, "ATELIER_MEDIA_URL_SECRET": "u" * 40}
    with pytest.raises(SettingsError, match="is a test setting"):
        MediaSettings.from_env({**prod, "ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS": "10.0.0.0/8"})
    with pytest.raises(SettingsError, match="ATELIER_MEDIA_IMPORT_CA_FILE"):
        MediaSettings.from_env({"ATELIER_MEDIA_IMPORT_CA_FILE": "/no/such/ca.pem"})

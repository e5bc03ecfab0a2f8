import pytest

from services.creation.settings import CreationSettings
from services.kit.settings import DEV_JWT_SECRET, EnvReader, MigrationSettings, SettingsError
from services.notify.settings import NotifySettings


def test_defaults_are_valid() -> None:
    settings = CreationSettings.from_env({})
    assert settings.lease_ttl_seconds == 60
    assert settings.common.tracing.exporter == "none"  # traces cost nothing unless asked
    assert settings.listen.public_port == 50051
    assert settings.common.jwt_secret == DEV_JWT_SECRET


def test_values_are_read_from_atelier_variables() -> None:
    settings = CreationSettings.from_env(
        {
            "ATELIER_LEASE_TTL": "120",
            "ATELIER_CREATION_PUBLIC_PORT": "6000",
            "ATELIER_MAX_ATTEMPTS": "5",
        }
    )
    assert settings.lease_ttl_seconds == 120
    assert settings.listen.public_port == 6000
    assert settings.max_attempts == 5


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ATELIER_LEASE_TTL", "-1", "ATELIER_LEASE_TTL must be between 5 and 3600 seconds"),
        ("ATELIER_LEASE_TTL", "soon", "ATELIER_LEASE_TTL must be a number of seconds"),
        ("ATELIER_CREATION_PUBLIC_PORT", "70000", "ATELIER_CREATION_PUBLIC_PORT must be between"),
        ("ATELIER_MAX_ATTEMPTS", "2.5", "ATELIER_MAX_ATTEMPTS must be a whole number"),
        ("ATELIER_ENV", "staging", "ATELIER_ENV must be one of dev, test, prod"),
        ("ATELIER_JWT_SECRET", "short", "ATELIER_JWT_SECRET must be at least 32 characters"),
        (
            "ATELIER_DATABASE_URL",
            "mysql://u:pw@db/x",
            "ATELIER_DATABASE_URL must be a postgresql:// URL",
        ),
        ("ATELIER_OTEL_EXPORTER", "zipkin", "ATELIER_OTEL_EXPORTER must be one of none, otlp"),
        ("ATELIER_OTEL_ENDPOINT", "collector:4317", "ATELIER_OTEL_ENDPOINT must be an http://"),
        ("ATELIER_OTEL_SAMPLE_RATIO", "1.5", "ATELIER_OTEL_SAMPLE_RATIO must be from 0 to 1"),
        ("ATELIER_OTEL_SAMPLE_RATIO", "half", "ATELIER_OTEL_SAMPLE_RATIO must be a number"),
        ("ATELIER_OTEL_EXPORT_DELAY", "0", "ATELIER_OTEL_EXPORT_DELAY must be between"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        CreationSettings.from_env({variable: value})


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        CreationSettings.from_env({"ATELIER_LEASE_TTL": "0", "ATELIER_DAILY_QUOTA": "-3"})
    assert "ATELIER_LEASE_TTL" in str(caught.value)
    assert "ATELIER_DAILY_QUOTA" in str(caught.value)


def test_heartbeat_must_fit_inside_the_lease() -> None:
    with pytest.raises(SettingsError, match="ATELIER_HEARTBEAT must be at most half"):
        CreationSettings.from_env({"ATELIER_LEASE_TTL": "10", "ATELIER_HEARTBEAT": "8"})


def test_a_secret_never_appears_in_the_message() -> None:
    with pytest.raises(SettingsError) as caught:
        CreationSettings.from_env({"ATELIER_SERVICE_TOKEN": "hunter2-but-short"})
    assert "hunter2" not in str(caught.value)


def test_prod_refuses_the_development_credentials() -> None:
    with pytest.raises(SettingsError) as caught:
        NotifySettings.from_env({"ATELIER_ENV": "prod"})
    assert "ATELIER_JWT_SECRET must be set in prod" in str(caught.value)
    assert "ATELIER_SERVICE_TOKEN must be set in prod" in str(caught.value)


def test_prod_starts_with_real_credentials() -> None:
    settings = NotifySettings.from_env(
        {
            "ATELIER_ENV": "prod",
            "ATELIER_JWT_SECRET": "j" * 40,
            "ATELIER_SERVICE_TOKEN": "s" * 40,
        }
    )
    assert settings.common.env == "prod"


def test_a_bad_database_url_never_shows_its_password() -> None:
    with pytest.raises(SettingsError) as caught:
        CreationSettings.from_env({"ATELIER_DATABASE_URL": "mysql://u:hunter2@db/x"})
    assert "hunter2" not in str(caught.value)


def test_the_token_lifetime_maximum_has_a_default_and_bounds() -> None:
    assert CreationSettings.from_env({}).common.jwt_max_lifetime_seconds == 24 * 3600
    configured = CreationSettings.from_env({"ATELIER_JWT_MAX_LIFETIME": "3600"})
    assert configured.common.jwt_max_lifetime_seconds == 3600
    for value in ("0", "10", str(365 * 86400)):
        with pytest.raises(SettingsError, match="ATELIER_JWT_MAX_LIFETIME must be between"):
            CreationSettings.from_env({"ATELIER_JWT_MAX_LIFETIME": value})


def test_tracing_is_read_from_otel_variables() -> None:
    tracing = CreationSettings.from_env(
        {
            "ATELIER_OTEL_EXPORTER": "otlp",
            "ATELIER_OTEL_ENDPOINT": "https://collector.internal:4317",
            "ATELIER_OTEL_SAMPLE_RATIO": "0.25",
            "ATELIER_OTEL_EXPORT_DELAY": "0.5",
        }
    ).common.tracing
    assert (tracing.exporter, tracing.endpoint, tracing.sample_ratio) == (
        "otlp",
        "https://collector.internal:4317",
        0.25,
    )
    assert tracing.export_delay_seconds == 0.5


def test_migrating_reads_only_the_database_in_every_environment() -> None:
    reader = EnvReader(
        {
            "ATELIER_ENV": "prod",
            "ATELIER_DATABASE_URL": "postgresql://atelier@db:5432/atelier",
            # Read by the services, not by a migration: no reason to refuse one.
            "ATELIER_LEASE_TTL": "-5",
        }
    )
    settings = MigrationSettings.read(reader)
    reader.finish()
    assert settings.database_url == "postgresql://atelier@db:5432/atelier"
    assert settings.connect_timeout_seconds == 1.5


def test_migrating_still_checks_what_it_reads() -> None:
    reader = EnvReader({"ATELIER_DATABASE_URL": "mysql://db/x", "ATELIER_DB_CONNECT_TIMEOUT": "0"})
    MigrationSettings.read(reader)
    with pytest.raises(SettingsError) as caught:
        reader.finish()
    assert "ATELIER_DATABASE_URL must be a postgresql:// URL" in str(caught.value)
    assert "ATELIER_DB_CONNECT_TIMEOUT must be between 0.1 and 120 seconds" in str(caught.value)


def test_automatic_recovery_is_on_for_the_stub_alone_by_default() -> None:
    assert CreationSettings.from_env({}).auto_adopt_providers == frozenset({"stub"})
    off = CreationSettings.from_env({"ATELIER_AUTO_ADOPT": "none"})
    assert off.auto_adopt_providers == frozenset()


def test_automatic_recovery_refuses_adapters_that_cannot_look_up() -> None:
    with pytest.raises(SettingsError, match="ATELIER_AUTO_ADOPT names providers whose adapter"):
        CreationSettings.from_env({"ATELIER_AUTO_ADOPT": "stub,replicate"})

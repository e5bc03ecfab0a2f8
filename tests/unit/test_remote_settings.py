"""The remote workers' server settings: pool credentials as hashes, two per pool while
one is rotated, refusals that never echo what was given as a hash; the TLS listener's
certificate checked at start."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from services.creation.remote.settings import RemoteSettings
from services.kit.auth import WorkerPoolAuthenticator
from services.kit.settings import EnvReader, SettingsError
from tests.support.certificates import TestAuthority


def digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def problems(env: dict[str, str]) -> str:
    reader = EnvReader(env)
    RemoteSettings.read(reader)
    with pytest.raises(SettingsError) as refused:
        reader.finish()
    return str(refused.value)


def test_a_pool_holds_its_old_and_new_credential_while_it_rotates() -> None:
    old, new, office = "gpu-credential-old-0001", "gpu-credential-new-0002", "office-cred-0003"
    value = f"gpu={digest(old)},office={digest(office)},gpu={digest(new)}"
    settings = RemoteSettings.read(EnvReader({"ATELIER_REMOTE_POOLS": value}))
    authenticator = WorkerPoolAuthenticator(settings.pools_by_hash)
    for credential, pool in ((old, "gpu"), (new, "gpu"), (office, "office")):
        principal = authenticator.authenticate([("authorization", f"Bearer {credential}")])
        assert principal.worker_pool == pool


def test_a_third_credential_for_one_pool_is_refused() -> None:
    value = ",".join(f"gpu={digest(f'credential-number-{n}')}" for n in range(3))
    assert "entry 3 gives gpu a credential hash beyond its 2" in problems(
        {"ATELIER_REMOTE_POOLS": value}
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        # The credential itself pasted where its hash belongs.
        ("gpu=raw-pool-credential-0123456789", "entry 1 (gpu) must give the SHA-256"),
        # No name at all: the whole entry may be the credential.
        ("raw-pool-credential-0123456789", "entry 1 must be name=sha256-hex"),
        (f"GPU={'a' * 64}", "entry 1 must be name=sha256-hex"),
        (f"a={'a' * 64},b={'A' * 64}", "entry 2 (b) repeats a credential hash already given"),
    ],
)
def test_a_bad_pools_setting_is_refused_without_echoing_it(value: str, said: str) -> None:
    message = problems({"ATELIER_REMOTE_POOLS": value})
    assert "ATELIER_REMOTE_POOLS" in message and said in message
    assert "raw-pool-credential" not in message and "a" * 64 not in message


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return TestAuthority(tmp_path).issue("remote")


def test_the_tls_listener_is_on_with_a_certificate_and_its_key(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    reader = EnvReader(
        {
            "ATELIER_REMOTE_POOLS": f"gpu={digest('gpu-credential-0001')}",
            "ATELIER_REMOTE_TLS_CERT": str(cert),
            "ATELIER_REMOTE_TLS_KEY": str(key),
            "ATELIER_CREATION_REMOTE_PORT": "50443",
        }
    )
    settings = RemoteSettings.read(reader)
    reader.finish()
    assert settings.tls is not None and settings.tls.certificate == cert
    assert settings.tls_port == 50443
    assert RemoteSettings.read(EnvReader({})).tls is None


def test_a_tls_setting_that_cannot_serve_stops_the_start(
    certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = certificate
    _, other_key = TestAuthority(tmp_path, "other").issue("other")
    pools = {"ATELIER_REMOTE_POOLS": f"gpu={digest('gpu-credential-0001')}"}
    assert "ATELIER_REMOTE_TLS_KEY must be set with ATELIER_REMOTE_TLS_CERT" in problems(
        {**pools, "ATELIER_REMOTE_TLS_CERT": str(cert)}
    )
    mismatch = problems(
        {**pools, "ATELIER_REMOTE_TLS_CERT": str(cert), "ATELIER_REMOTE_TLS_KEY": str(other_key)}
    )
    assert f"the key {other_key} is not the key of the certificate {cert}" in mismatch
    missing = problems(
        {
            **pools,
            "ATELIER_REMOTE_TLS_CERT": str(tmp_path / "absent.crt"),
            "ATELIER_REMOTE_TLS_KEY": str(key),
        }
    )
    assert "ATELIER_REMOTE_TLS_CERT cannot be used: cannot read the certificate" in missing
    # A key file where the certificate belongs: named, its contents never shown.
    swapped = problems(
        {**pools, "ATELIER_REMOTE_TLS_CERT": str(key), "ATELIER_REMOTE_TLS_KEY": str(key)}
    )
    assert "holds no PEM certificate" in swapped and "PRIVATE KEY" not in swapped
    assert "ATELIER_REMOTE_POOLS names no pool" in problems(
        {"ATELIER_REMOTE_TLS_CERT": str(cert), "ATELIER_REMOTE_TLS_KEY": str(key)}
    )

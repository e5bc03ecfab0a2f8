"""How the reference remote worker dials: TLS unless told otherwise, trusting the CA it
is given, and plaintext only to a loopback address unless that too is said."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.creation.remote_worker.settings import RemoteWorkerSettings, is_loopback
from services.kit.settings import EnvReader, SettingsError
from tests.support.certificates import TestAuthority

CREDENTIAL = {"ATELIER_REMOTE_WORKER_CREDENTIAL": "a-pool-credential-0123456789"}


def read(env: dict[str, str], address: str = "") -> RemoteWorkerSettings:
    reader = EnvReader({**CREDENTIAL, **env})
    settings = RemoteWorkerSettings.read(reader, address)
    reader.finish()
    return settings


def refusal(env: dict[str, str], address: str = "") -> str:
    with pytest.raises(SettingsError) as refused:
        read(env, address)
    return str(refused.value)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50061", True),
        ("127.8.9.10:1", True),
        ("localhost:50071", True),
        ("[::1]:50071", True),
        ("dns:///localhost:50071", True),
        ("unix:/run/atelier.sock", True),
        ("creation-internal:50061", False),
        ("workers.atelier.example:443", False),
        ("10.0.0.7:50071", False),
        ("[2001:db8::1]:443", False),
        ("localhost.evil.example:443", False),
    ],
)
def test_loopback_is_only_what_cannot_leave_the_machine(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_tls_is_the_default_and_the_address_comes_from_the_flag_or_the_setting(
    tmp_path: Path,
) -> None:
    ca = TestAuthority(tmp_path).ca_path
    settings = read(
        {"ATELIER_REMOTE_WORKER_CA": str(ca), "ATELIER_REMOTE_WORKER_ADDRESS": "w.example:443"}
    )
    assert settings.uses_tls and settings.ca == ca and settings.address == "w.example:443"
    assert read({}, "flag.example:443").address == "flag.example:443"
    assert "ATELIER_REMOTE_WORKER_ADDRESS is required" in refusal({})


def test_plaintext_to_another_machine_is_refused_unless_said_so() -> None:
    message = refusal({"ATELIER_REMOTE_WORKER_PLAINTEXT": "loopback"}, "creation-internal:50061")
    assert "ATELIER_REMOTE_WORKER_PLAINTEXT is loopback, but creation-internal:50061" in message
    assert "in the clear" in message
    assert not read({"ATELIER_REMOTE_WORKER_PLAINTEXT": "loopback"}, "127.0.0.1:50061").uses_tls
    anywhere = read({"ATELIER_REMOTE_WORKER_PLAINTEXT": "anywhere"}, "creation-internal:50061")
    assert not anywhere.uses_tls
    assert "must be one of off, loopback, anywhere" in refusal(
        {"ATELIER_REMOTE_WORKER_PLAINTEXT": "yes"}, "127.0.0.1:1"
    )


def test_a_ca_that_cannot_be_used_is_refused_at_start(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    assert f"ATELIER_REMOTE_WORKER_CA cannot be used: the CA {not_pem} holds no PEM" in refusal(
        {"ATELIER_REMOTE_WORKER_CA": str(not_pem)}, "w.example:443"
    )
    assert "cannot read the CA" in refusal(
        {"ATELIER_REMOTE_WORKER_CA": str(tmp_path / "absent.pem")}, "w.example:443"
    )
    ca = TestAuthority(tmp_path).ca_path
    assert "ATELIER_REMOTE_WORKER_CA is for TLS" in refusal(
        {"ATELIER_REMOTE_WORKER_CA": str(ca), "ATELIER_REMOTE_WORKER_PLAINTEXT": "loopback"},
        "127.0.0.1:1",
    )

"""`atelier push doctor`'s checks: the key, the ids, the bundle and its topics, the hosts
per environment, and the command's exit code."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from services.cli import main
from services.notify.apns.doctor import (
    Level,
    check_bundle,
    check_hosts,
    check_key,
    check_registered,
    check_settings,
    check_topic,
    failed,
    invalid_provider_token_cause,
)
from services.notify.apns.settings import PRODUCTION_URL, SANDBOX_URL, ApnsSettings


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture
def p256_key(tmp_path: Path) -> Path:
    path = tmp_path / "AuthKey.p8"
    path.write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    return path


def settings(key_path: Path) -> ApnsSettings:
    return ApnsSettings(
        enabled=True,
        key_path=str(key_path),
        key_id="ABC123DEFG",
        team_id="TEAM123456",
        bundle_id="com.example.atelier",
    )


def test_good_settings_pass_and_name_topics_and_hosts(p256_key: Path) -> None:
    findings = check_settings(settings(p256_key))
    assert not failed(findings)
    text = "\n".join(f.line() for f in findings)
    assert "com.example.atelier.push-type.liveactivity" in text
    assert f"sandbox tokens go to {SANDBOX_URL}" in text
    assert f"production tokens go to {PRODUCTION_URL}" in text


def test_a_key_on_another_curve_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p384.p8"
    path.write_bytes(pem(ec.generate_private_key(ec.SECP384R1())))
    finding = check_key(str(path))
    assert finding.level is Level.PROBLEM
    assert "secp384r1, not P-256" in finding.message


def test_an_rsa_key_is_not_a_p256_key(tmp_path: Path) -> None:
    path = tmp_path / "rsa.p8"
    path.write_bytes(pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    finding = check_key(str(path))
    assert finding.level is Level.PROBLEM
    assert "not an EC P-256 key" in finding.message


def test_a_file_that_is_no_key_or_is_missing_is_named(tmp_path: Path) -> None:
    path = tmp_path / "junk.p8"
    path.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    assert "not an unencrypted PEM private key" in check_key(str(path)).message
    assert "cannot read the key file" in check_key(str(tmp_path / "absent.p8")).message


def test_the_key_content_never_appears_in_findings(tmp_path: Path) -> None:
    path = tmp_path / "rsa.p8"
    content = pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    path.write_bytes(content)
    body_line = content.decode().splitlines()[1]
    assert body_line not in check_key(str(path)).line()


@pytest.mark.parametrize("key_id", ["ABC123", "abc123defg", "ABC123DEFGH", "ABC-123DEF"])
def test_a_key_id_of_the_wrong_shape_is_a_problem(p256_key: Path, key_id: str) -> None:
    findings = check_settings(replace(settings(p256_key), key_id=key_id))
    [finding] = [f for f in findings if f.check == "key id"]
    assert finding.level is Level.PROBLEM
    assert "10 capital letters or digits" in finding.message


def test_a_team_id_of_the_wrong_shape_is_a_problem(p256_key: Path) -> None:
    findings = check_settings(replace(settings(p256_key), team_id="team"))
    assert [f.check for f in findings if f.level is Level.PROBLEM] == ["team id"]


@pytest.mark.parametrize(
    "bundle_id", ["atelier", "com.example.atelier.push-type.liveactivity", "com example.app"]
)
def test_a_bundle_id_that_is_no_app_bundle_is_a_problem(bundle_id: str) -> None:
    assert check_bundle(bundle_id).level is Level.PROBLEM


def test_a_topic_that_does_not_match_the_bundle_is_a_problem() -> None:
    bundle = "com.example.atelier"
    assert check_topic(bundle, "alert", bundle).level is Level.OK
    assert check_topic(bundle, "liveactivity", bundle + ".push-type.liveactivity").level is Level.OK
    wrong = check_topic(bundle, "liveactivity", bundle)
    assert wrong.level is Level.PROBLEM
    assert "com.example.atelier.push-type.liveactivity" in wrong.message
    assert check_topic(bundle, "alert", "com.other.app").level is Level.PROBLEM


def test_tokens_registered_for_another_bundle_are_a_problem(p256_key: Path) -> None:
    found = check_registered(
        settings(p256_key),
        [("production", "com.example.atelier", 3), ("sandbox", "com.other.app", 1)],
    )
    assert [f.level for f in found] == [Level.OK, Level.PROBLEM]
    assert PRODUCTION_URL in found[0].message


def test_swapped_hosts_are_a_problem_and_a_test_peer_a_warning(p256_key: Path) -> None:
    swapped = replace(settings(p256_key), production_url=SANDBOX_URL)
    [production] = [f for f in check_hosts(swapped) if f.check == "host (production)"]
    assert production.level is Level.PROBLEM
    peer = replace(settings(p256_key), sandbox_url="https://127.0.0.1:9443")
    [sandbox] = [f for f in check_hosts(peer) if f.check == "host (sandbox)"]
    assert sandbox.level is Level.WARNING
    assert "https://127.0.0.1:9443" in sandbox.message


def test_the_command_exits_non_zero_on_a_problem(
    p256_key: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in {
        "KEY_PATH": str(p256_key),
        "KEY_ID": "ABC123DEFG",
        "TEAM_ID": "TEAM123456",
        "BUNDLE_ID": "com.example.atelier",
    }.items():
        monkeypatch.setenv(f"ATELIER_APNS_{name}", value)
    assert main(["push", "doctor", "--no-database", "--offline"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    monkeypatch.setenv("ATELIER_APNS_KEY_ID", "short")
    assert main(["push", "doctor", "--no-database", "--offline"]) == 1
    assert "FAIL key id" in capsys.readouterr().out
    assert main(["push", "doctor", "--no-database", "--send-to", "ab" * 32]) == 2


def test_invalid_provider_token_is_narrowed_by_the_name_apple_gave_the_key_file() -> None:
    def cause(key_path: str) -> str:
        return invalid_provider_token_cause(replace(settings(Path(key_path)), key_id="ABC123DEFG"))

    assert "one of the two is wrong" in cause("/keys/AuthKey_ZZZ999ZZZZ.p8")
    assert "ATELIER_APNS_TEAM_ID (TEAM123456) is most likely" in cause("/k/AuthKey_ABC123DEFG.p8")
    renamed = cause("/keys/apns.p8")
    for variable in ("ATELIER_APNS_KEY_ID", "ATELIER_APNS_TEAM_ID", "ATELIER_APNS_KEY_PATH"):
        assert variable in renamed

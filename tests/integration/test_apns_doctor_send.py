"""`atelier push doctor` as a user runs it: a real process pushing to the APNs peer (its
own process too), by default to a dummy device token on each host (400 BadDeviceToken:
the credentials were accepted; a refusal names the setting at fault), or with
`--send-to` a test push to a real token, and printing Apple's answer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.dev import apns_peer
from tests.support.cli import atelier

pytestmark = pytest.mark.integration

GOOD = "ab" * 32
GONE = "cd" * 32
MISMATCHED = "ef" * 32


@pytest.fixture
def peer_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    key_path, public_path = apns_peer.ensure_dev_key(tmp_path / "key")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.dev.apns_peer",
            "--public-key",
            str(public_path),
            "--key-id",
            apns_peer.DEV_KEY_ID,
            "--team-id",
            apns_peer.DEV_TEAM_ID,
            "--bundle-id",
            apns_peer.DEV_BUNDLE_ID,
            "--state-dir",
            str(tmp_path / "peer"),
            "--fail",
            f"{GONE}=410:Unregistered",
            "--fail",
            f"{MISMATCHED}=400:BadDeviceToken",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        # Apple's name for the key file carries the key id.
        apple_named = key_path.with_name(f"AuthKey_{apns_peer.DEV_KEY_ID}.p8")
        apple_named.write_bytes(key_path.read_bytes())
        yield {
            "ATELIER_APNS_KEY_PATH": str(apple_named),
            "ATELIER_APNS_KEY_ID": apns_peer.DEV_KEY_ID,
            "ATELIER_APNS_TEAM_ID": apns_peer.DEV_TEAM_ID,
            "ATELIER_APNS_BUNDLE_ID": apns_peer.DEV_BUNDLE_ID,
            "ATELIER_APNS_SANDBOX_URL": ready["url"],
            "ATELIER_APNS_PRODUCTION_URL": ready["url"],
            "ATELIER_APNS_CA_FILE": ready["ca_file"],
        }
    finally:
        process.terminate()
        process.wait(10)


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return atelier("push", "doctor", "--no-database", *args, env=env)


def test_a_test_push_prints_apples_acceptance(peer_env: dict[str, str]) -> None:
    done = doctor(peer_env, "--send-to", GOOD, "--environment", "sandbox")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   test push: Apple accepted it (sandbox token …abababab" in done.stdout
    assert GOOD not in done.stdout + done.stderr
    # The peer is not Apple: the doctor says so for each environment.
    assert done.stdout.count("which is not Apple's") == 2


def test_a_refused_test_push_prints_apples_answer_and_fails(peer_env: dict[str, str]) -> None:
    done = doctor(peer_env, "--send-to", GONE, "--environment", "production")
    assert done.returncode == 1
    assert "FAIL test push: 410 Unregistered (production token …cdcdcdcd" in done.stdout


def test_bad_device_token_names_the_likely_environment_mismatch(
    peer_env: dict[str, str],
) -> None:
    done = doctor(peer_env, "--send-to", MISMATCHED, "--environment", "production")
    assert done.returncode == 1
    assert "400 BadDeviceToken" in done.stdout
    assert "most likely the token belongs to sandbox" in done.stdout


def test_no_test_push_is_sent_while_a_setting_is_wrong(peer_env: dict[str, str]) -> None:
    done = doctor(
        {**peer_env, "ATELIER_APNS_KEY_ID": "bad"}, "--send-to", GOOD, "--environment", "sandbox"
    )
    assert done.returncode == 1
    assert "FAIL key id" in done.stdout
    assert "FAIL test push: not sent" in done.stdout


def test_by_default_a_dummy_push_proves_the_credentials_on_both_hosts(
    peer_env: dict[str, str],
) -> None:
    done = doctor(peer_env)
    assert done.returncode == 0, done.stdout + done.stderr
    for environment in ("sandbox", "production"):
        line = next(x for x in done.stdout.splitlines() if f"credentials ({environment})" in x)
        assert line.startswith("ok ")
        assert "400 BadDeviceToken" in line


@pytest.mark.parametrize(
    ("setting", "value", "answer", "named"),
    [
        ("ATELIER_APNS_TEAM_ID", "OTHERTEAM1", "403 InvalidProviderToken", "ATELIER_APNS_TEAM_ID"),
        ("ATELIER_APNS_KEY_ID", "OTHERKEY01", "403 InvalidProviderToken", "ATELIER_APNS_KEY_ID"),
        (
            "ATELIER_APNS_BUNDLE_ID",
            "com.other.app",
            "400 TopicDisallowed",
            "ATELIER_APNS_BUNDLE_ID",
        ),
    ],
)
def test_a_refused_dummy_push_names_the_setting_at_fault(
    peer_env: dict[str, str], setting: str, value: str, answer: str, named: str
) -> None:
    done = doctor({**peer_env, setting: value})
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [x for x in done.stdout.splitlines() if "credentials (sandbox)" in x]
    assert line.startswith("FAIL")
    assert answer in line
    assert named in line
    assert "eyJ" not in done.stdout + done.stderr  # no provider token (a JWT) printed


def test_a_key_file_of_another_key_is_named_without_printing_it(
    peer_env: dict[str, str], tmp_path: Path
) -> None:
    other = tmp_path / "AuthKey_OTHERKEY01.p8"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    other.write_bytes(pem)
    done = doctor({**peer_env, "ATELIER_APNS_KEY_PATH": str(other)})
    assert done.returncode == 1
    [line] = [x for x in done.stdout.splitlines() if "credentials (production)" in x]
    assert "403 InvalidProviderToken" in line
    assert "ATELIER_APNS_KEY_ID is DEVKEY0001 but ATELIER_APNS_KEY_PATH is the file" in line
    assert "one of the two is wrong" in line
    for secret_line in pem.decode().splitlines()[1:-1]:
        assert secret_line not in done.stdout + done.stderr


def test_a_test_push_refused_for_the_credentials_names_the_setting(
    peer_env: dict[str, str],
) -> None:
    done = doctor(
        {**peer_env, "ATELIER_APNS_TEAM_ID": "OTHERTEAM1"},
        "--send-to",
        GOOD,
        "--environment",
        "sandbox",
    )
    assert done.returncode == 1
    [line] = [x for x in done.stdout.splitlines() if x.startswith("FAIL test push")]
    assert "403 InvalidProviderToken" in line
    assert "ATELIER_APNS_TEAM_ID (OTHERTEAM1) is most likely not the team" in line

"""`atelier push doctor --send-to` as a user runs it: a real process sending a test push to
the APNs peer (its own process too) and printing Apple's answer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
        yield {
            "ATELIER_APNS_KEY_PATH": str(key_path),
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

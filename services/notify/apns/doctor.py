"""`atelier push doctor`: checks the APNs settings before they bite. Each check is a
:class:`Finding`; any problem makes the command exit non-zero."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from services.notify.apns.keys import KeyProblem, load_signing_key
from services.notify.apns.refusals import setting_at_fault
from services.notify.apns.rules import BUNDLE_ID, KEY_ID, LIVE_ACTIVITY_SUFFIX, TEAM_ID, topic_for
from services.notify.apns.settings import (
    ENVIRONMENTS,
    PRODUCTION_URL,
    SANDBOX_URL,
    ApnsSettings,
)


class Level(enum.Enum):
    OK = "ok"
    WARNING = "warn"
    PROBLEM = "FAIL"


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    message: str

    def line(self) -> str:
        return f"{self.level.value:<4} {self.check}: {self.message}"


def ok(check: str, message: str) -> Finding:
    return Finding(Level.OK, check, message)


def problem(check: str, message: str) -> Finding:
    return Finding(Level.PROBLEM, check, message)


def check_settings(settings: ApnsSettings) -> list[Finding]:
    return [
        check_key(settings.key_path),
        check_identifier("key id", settings.key_id, "ATELIER_APNS_KEY_ID", KEY_ID.fullmatch),
        check_identifier("team id", settings.team_id, "ATELIER_APNS_TEAM_ID", TEAM_ID.fullmatch),
        check_bundle(settings.bundle_id),
        *check_hosts(settings),
    ]


def check_key(path: str) -> Finding:
    if not path:
        return problem("key", "ATELIER_APNS_KEY_PATH is not set (the .p8 file from Apple)")
    try:
        load_signing_key(path)
    except KeyProblem as error:
        return problem("key", str(error))
    return ok("key", f"{path} is a P-256 EC private key (ES256)")


def check_identifier(
    check: str, value: str, variable: str, matches: Callable[[str], object]
) -> Finding:
    if not value:
        return problem(check, f"{variable} is not set")
    if not matches(value):
        return problem(
            check,
            f"{value!r} is not 10 capital letters or digits, the shape Apple's developer "
            f"account shows ({variable})",
        )
    return ok(check, value)


def check_bundle(bundle_id: str) -> Finding:
    if not bundle_id:
        return problem("bundle id", "ATELIER_APNS_BUNDLE_ID is not set")
    if bundle_id.endswith(LIVE_ACTIVITY_SUFFIX) or not BUNDLE_ID.fullmatch(bundle_id):
        return problem(
            "bundle id",
            f"{bundle_id!r} is not an app bundle id (reverse DNS like com.example.app, "
            f"without the {LIVE_ACTIVITY_SUFFIX} suffix)",
        )
    return ok(
        "bundle id",
        f"{bundle_id}: alert topic {topic_for(bundle_id, 'alert')}, Live Activity topic "
        f"{topic_for(bundle_id, 'liveactivity')}",
    )


def check_topic(bundle_id: str, push_type: str, topic: str) -> Finding:
    """A topic a push carries (or a token was registered for) against the bundle id."""
    expected = topic_for(bundle_id, push_type)
    if topic != expected:
        return problem(
            "topic",
            f"{topic!r} does not match bundle id {bundle_id!r}: a {push_type} push needs "
            f"apns-topic {expected!r}",
        )
    return ok("topic", f"{push_type} → {topic}")


def check_hosts(settings: ApnsSettings) -> list[Finding]:
    findings: list[Finding] = []
    apple = {PRODUCTION_URL: "production", SANDBOX_URL: "sandbox"}
    for environment in ENVIRONMENTS:
        url = settings.base_url(environment)
        meant_for = apple.get(url)
        if meant_for is not None and meant_for != environment:
            findings.append(
                problem(
                    f"host ({environment})",
                    f"{environment} tokens would go to Apple's {meant_for} host {url}: "
                    "every one would be answered BadDeviceToken",
                )
            )
        elif meant_for is None:
            findings.append(
                Finding(
                    Level.WARNING,
                    f"host ({environment})",
                    f"{environment} tokens go to {url}, which is not Apple's (a test peer?)",
                )
            )
        else:
            findings.append(ok(f"host ({environment})", f"{environment} tokens go to {url}"))
    return findings


# The name Apple gives a downloaded key: AuthKey_<key id>.p8.
_APPLE_KEY_FILE = re.compile(r"AuthKey_([A-Z0-9]{10})\.p8")


def key_file_id(key_path: str) -> str | None:
    """The key id in the name Apple gave the key file, if it still has that name."""
    match = _APPLE_KEY_FILE.fullmatch(Path(key_path).name)
    return match.group(1) if match else None


def invalid_provider_token_cause(settings: ApnsSettings) -> str:
    """403 InvalidProviderToken does not say which of key id, team id and key file is
    wrong; the key file's name as Apple gave it narrows it down."""
    file_id = key_file_id(settings.key_path)
    if file_id is not None and file_id != settings.key_id:
        return (
            f"ATELIER_APNS_KEY_ID is {settings.key_id} but ATELIER_APNS_KEY_PATH is the file "
            f"Apple named for key {file_id}: one of the two is wrong"
        )
    if file_id is not None:
        return (
            f"the key file and ATELIER_APNS_KEY_ID agree ({file_id}): ATELIER_APNS_TEAM_ID "
            f"({settings.team_id}) is most likely not the team that made the key, or the key "
            "was revoked (or this machine's clock is ahead)"
        )
    return setting_at_fault("InvalidProviderToken")


def check_registered(
    settings: ApnsSettings, registered: Iterable[tuple[str, str, int]]
) -> list[Finding]:
    """Active tokens by (environment, bundle id, count): the host each will use, and any
    registered for another app than the one the sender signs for."""
    findings: list[Finding] = []
    for environment, bundle_id, count in registered:
        host = settings.base_url(environment)
        if bundle_id != settings.bundle_id:
            findings.append(
                problem(
                    "registered tokens",
                    f"{count} {environment} token(s) registered for bundle {bundle_id!r}, "
                    f"but pushes are sent with topic {settings.bundle_id!r} "
                    "(Apple answers DeviceTokenNotForTopic)",
                )
            )
        else:
            findings.append(ok("registered tokens", f"{count} {environment} token(s) → {host}"))
    return findings


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.level is Level.PROBLEM for f in findings)

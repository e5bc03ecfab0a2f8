"""What `atelier push doctor` runs: the settings checks, the tokens registered in the
database, then a push that proves the credentials without a device: to a well-formed
dummy device token on each host (400 BadDeviceToken means APNs accepted the provider token
and the topic; a refusal names the setting at fault), or a test push to a real token."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping

from services.kit.settings import CommonSettings, EnvReader
from services.notify.apns.client import ApnsClient
from services.notify.apns.doctor import (
    Finding,
    Level,
    check_registered,
    check_settings,
    check_topic,
    failed,
    invalid_provider_token_cause,
    ok,
    problem,
)
from services.notify.apns.keys import load_signing_key
from services.notify.apns.outcomes import Answer
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.refusals import SETTING_AT_FAULT, setting_at_fault
from services.notify.apns.rules import DUMMY_DEVICE_TOKEN, token_tail
from services.notify.apns.settings import ENVIRONMENTS, ApnsSettings
from services.notify.store.doctor import TokensUnreadable, database_location, registered_tokens

TEST_PAYLOAD = {"aps": {"alert": {"title": "atelier push doctor", "body": "A test push."}}}
ALERT_HEADERS = {"apns-push-type": "alert", "apns-priority": "10", "apns-expiration": "0"}


def run(
    send_to: str | None,
    environment: str,
    check_database: bool,
    environ: Mapping[str, str] | None = None,
    *,
    probe: bool = True,
    preface: list[Finding] | None = None,
) -> int:
    reader = EnvReader(environ)
    common = CommonSettings.read(reader)
    settings = ApnsSettings.read(reader)
    reader.finish()
    findings = [*(preface or []), *check_settings(settings)]
    if check_database:
        findings += asyncio.run(_registered(settings, common.database_url))
    if send_to is not None:
        findings.append(check_topic(settings.bundle_id, "alert", settings.bundle_id))
        if not failed(findings):
            findings.append(asyncio.run(_test_push(settings, send_to.lower(), environment)))
        else:
            findings.append(problem("test push", "not sent: fix the problems above first"))
    elif probe:
        if not failed(findings):
            findings += asyncio.run(_probe(settings))
        else:
            findings.append(problem("credentials", "not tried with APNs: fix the problems above"))
    for finding in findings:
        print(finding.line())
    return 1 if failed(findings) else 0


async def _registered(settings: ApnsSettings, database_url: str) -> list[Finding]:
    try:
        rows = await registered_tokens(database_url)
    except TokensUnreadable as unreadable:
        return [
            Finding(
                Level.WARNING,
                "registered tokens",
                f"could not read notify.push_tokens at {database_location(database_url)} "
                f"({unreadable.kind}): is ATELIER_DATABASE_URL the database notify "
                "uses, running and migrated?",
            )
        ]
    if not rows:
        return [ok("registered tokens", "none yet")]
    return check_registered(settings, rows)


async def _probe(settings: ApnsSettings) -> list[Finding]:
    """A push to a dummy device token on each host: APNs checks the provider token and
    the topic before the device token, so 400 BadDeviceToken proves the first two."""
    token = _provider_token(settings)
    client = ApnsClient(settings)
    try:
        answers = [
            (
                environment,
                await _send(client, token.current(), settings, environment, DUMMY_DEVICE_TOKEN),
            )
            for environment in ENVIRONMENTS
        ]
    finally:
        await client.close()
    return [_credentials_finding(settings, environment, a) for environment, a in answers]


def _credentials_finding(settings: ApnsSettings, environment: str, answer: Answer) -> Finding:
    check = f"credentials ({environment})"
    host = settings.base_url(environment)
    if answer.status == 400 and answer.reason == "BadDeviceToken":
        return ok(
            check,
            f"{host} accepted the provider token (key {settings.key_id}, team "
            f"{settings.team_id}) and topic {settings.bundle_id}: it answered a dummy "
            "device token 400 BadDeviceToken",
        )
    if answer.status == 200:
        return Finding(
            Level.WARNING, check, f"{host} accepted a push to a dummy device token: not APNs?"
        )
    return problem(check, _refusal(settings, environment, answer))


def _refusal(settings: ApnsSettings, environment: str, answer: Answer) -> str:
    host = settings.base_url(environment)
    if answer.status == 0:
        variable = f"ATELIER_APNS_{environment.upper()}_URL"
        return (
            f"no answer from {host} ({answer.reason}): check the network, {variable} and "
            "ATELIER_APNS_CA_FILE"
        )
    if answer.reason == "InvalidProviderToken":
        at_fault = invalid_provider_token_cause(settings)
    elif answer.reason in SETTING_AT_FAULT:
        at_fault = setting_at_fault(answer.reason)
    else:
        at_fault = "not a refusal of the credentials; see docs/operations.md (failed pushes)"
    return f"{answer.status} {answer.reason} from {host}: {at_fault}"


def _provider_token(settings: ApnsSettings) -> ProviderToken:
    key = load_signing_key(settings.key_path)
    return ProviderToken(key, settings.key_id, settings.team_id, settings.token_refresh_seconds)


async def _send(
    client: ApnsClient, jwt: str, settings: ApnsSettings, environment: str, device_token: str
) -> Answer:
    headers = {**ALERT_HEADERS, "apns-topic": settings.bundle_id}
    body = json.dumps(TEST_PAYLOAD).encode()
    return await client.send(environment, device_token, headers, body, str(uuid.uuid4()), jwt)


async def _test_push(settings: ApnsSettings, device_token: str, environment: str) -> Finding:
    client = ApnsClient(settings)
    try:
        jwt = _provider_token(settings).current()
        answer = await _send(client, jwt, settings, environment, device_token)
    finally:
        await client.close()
    where = f"{environment} token {token_tail(device_token)} via {settings.base_url(environment)}"
    if answer.status == 200:
        return ok("test push", f"Apple accepted it ({where}), apns-id {answer.apns_id}")
    hint = ""
    if answer.reason == "BadDeviceToken":
        other = "sandbox" if environment == "production" else "production"
        hint = (
            f"; most likely the token belongs to {other} (TestFlight, App Store and Ad Hoc "
            "builds use production)"
        )
    elif answer.reason == "InvalidProviderToken":
        hint = f"; {invalid_provider_token_cause(settings)}"
    elif answer.reason in SETTING_AT_FAULT:
        hint = f"; {setting_at_fault(answer.reason)}"
    status = answer.status or "no answer"
    return problem(
        "test push", f"{status} {answer.reason} ({where}), apns-id {answer.apns_id}{hint}"
    )

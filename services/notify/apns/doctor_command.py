"""What `atelier push doctor` runs: the settings checks, the tokens registered in the
database, and optionally one test push whose answer from Apple is printed."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping

from sqlalchemy import text

from services.kit.db import create_engine
from services.kit.settings import CommonSettings, EnvReader
from services.notify.apns.client import ApnsClient
from services.notify.apns.doctor import (
    Finding,
    Level,
    check_registered,
    check_settings,
    check_topic,
    failed,
    ok,
    problem,
)
from services.notify.apns.keys import load_signing_key
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.rules import token_tail
from services.notify.apns.settings import ApnsSettings

REGISTERED = text(
    "SELECT environment, bundle_id, count(*) FROM notify.push_tokens"
    " WHERE status = 'active' GROUP BY environment, bundle_id ORDER BY environment, bundle_id"
)
TEST_PAYLOAD = {"aps": {"alert": {"title": "atelier push doctor", "body": "A test push."}}}


def run(
    send_to: str | None,
    environment: str,
    check_database: bool,
    environ: Mapping[str, str] | None = None,
) -> int:
    reader = EnvReader(environ)
    common = CommonSettings.read(reader)
    settings = ApnsSettings.read(reader)
    reader.finish()
    findings = check_settings(settings)
    if check_database:
        findings += asyncio.run(_registered(settings, common.database_url))
    if send_to is not None:
        findings.append(check_topic(settings.bundle_id, "alert", settings.bundle_id))
        if not failed(findings):
            findings.append(asyncio.run(_test_push(settings, send_to.lower(), environment)))
        else:
            findings.append(problem("test push", "not sent: fix the problems above first"))
    for finding in findings:
        print(finding.line())
    return 1 if failed(findings) else 0


async def _registered(settings: ApnsSettings, database_url: str) -> list[Finding]:
    engine = create_engine(database_url, application_name="atelier-push-doctor")
    try:
        async with engine.connect() as connection:
            rows = (await connection.execute(REGISTERED)).all()
    except Exception as error:
        # The message could hold the URL's password: name the kind of failure only.
        return [
            Finding(
                Level.WARNING,
                "registered tokens",
                f"could not read notify.push_tokens ({type(error).__name__})",
            )
        ]
    finally:
        await engine.dispose()
    if not rows:
        return [ok("registered tokens", "none yet")]
    return check_registered(settings, [(r[0], r[1], int(r[2])) for r in rows])


async def _test_push(settings: ApnsSettings, device_token: str, environment: str) -> Finding:
    key = load_signing_key(settings.key_path)
    token = ProviderToken(key, settings.key_id, settings.team_id, settings.token_refresh_seconds)
    client = ApnsClient(settings)
    headers = {
        "apns-push-type": "alert",
        "apns-topic": settings.bundle_id,
        "apns-priority": "10",
        "apns-expiration": "0",
    }
    apns_id = str(uuid.uuid4())
    try:
        answer = await client.send(
            environment,
            device_token,
            headers,
            json.dumps(TEST_PAYLOAD).encode(),
            apns_id,
            token.current(),
        )
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
    status = answer.status or "no answer"
    return problem(
        "test push", f"{status} {answer.reason} ({where}), apns-id {answer.apns_id}{hint}"
    )

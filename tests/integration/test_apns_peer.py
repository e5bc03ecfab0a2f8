"""The local APNs peer holds pushes to Apple's rules: a request it accepts is one Apple
would, and each kind of mistake gets Apple's answer (so the sender's tests mean something)."""

from __future__ import annotations

import importlib.util
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from services.dev import apns_peer
from services.dev.apns_peer import ApnsPeer
from services.notify.apns import rules as notify_rules
from services.notify.apns.keys import load_signing_key
from tests.support.apns_peer import (
    BUNDLE_ID,
    KEY_ID,
    TEAM_ID,
    alert,
    device_token,
    live_activity_update,
    provider_key,
    running_peer,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def peer_and_key(
    tmp_path: Path,
) -> AsyncIterator[tuple[ApnsPeer, ec.EllipticCurvePrivateKey]]:
    async with running_peer(tmp_path) as (peer, key_path):
        yield peer, load_signing_key(str(key_path))


def provider_token(key: ec.EllipticCurvePrivateKey, **changes: Any) -> str:
    claims = {"iss": TEAM_ID, "iat": int(time.time())}
    headers = {"kid": KEY_ID}
    claims.update({k: v for k, v in changes.items() if k in ("iss", "iat")})
    headers.update({k: v for k, v in changes.items() if k == "kid"})
    return jwt.encode(claims, key, algorithm="ES256", headers=headers)


async def post(
    peer: ApnsPeer, token: str, headers: dict[str, str], payload: Any, jwt_value: str
) -> tuple[int, str]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    verify = ssl.create_default_context(cafile=peer.ca_file)
    async with httpx.AsyncClient(http2=True, verify=verify) as client:
        response = await client.post(
            f"{peer.url}/3/device/{token}",
            content=body,
            headers={**headers, "authorization": f"bearer {jwt_value}"},
        )
    assert response.http_version == "HTTP/2"
    reason = response.json()["reason"] if response.content else ""
    return response.status_code, reason


async def test_a_well_formed_push_is_accepted_and_recorded(
    peer_and_key: tuple[ApnsPeer, ec.EllipticCurvePrivateKey],
) -> None:
    peer, key = peer_and_key
    token = device_token()
    headers, payload = alert()
    assert await post(peer, token, headers, payload, provider_token(key)) == (200, "")
    [received] = peer.received_by(token)
    assert received.payload == payload


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"kid": "OTHERKEY00"}, "InvalidProviderToken"),
        ({"iss": "OTHERTEAM0"}, "InvalidProviderToken"),
        ({"iat": int(time.time()) - 3700}, "ExpiredProviderToken"),
    ],
)
async def test_provider_tokens_are_checked(
    peer_and_key: tuple[ApnsPeer, ec.EllipticCurvePrivateKey], changes: dict[str, Any], reason: str
) -> None:
    peer, key = peer_and_key
    headers, payload = alert()
    answer = await post(peer, device_token(), headers, payload, provider_token(key, **changes))
    assert answer == (403, reason)


async def test_a_token_signed_with_another_key_is_refused(
    peer_and_key: tuple[ApnsPeer, ec.EllipticCurvePrivateKey],
) -> None:
    peer, _ = peer_and_key
    other = ec.generate_private_key(ec.SECP256R1())
    headers, payload = alert()
    answer = await post(peer, device_token(), headers, payload, provider_token(other))
    assert answer == (403, "InvalidProviderToken")


def _with(message: tuple[dict[str, str], dict[str, Any]], **headers: str | None) -> dict[str, str]:
    merged: dict[str, str | None] = {**message[0], **headers}
    return {k: v for k, v in merged.items() if v is not None}


@pytest.mark.parametrize(
    ("headers", "payload", "status", "reason"),
    [
        (
            _with(alert(), **{"apns-topic": BUNDLE_ID + ".push-type.liveactivity"}),
            alert()[1],
            400,
            "TopicDisallowed",
        ),
        (
            _with(live_activity_update(0.1), **{"apns-topic": BUNDLE_ID}),
            live_activity_update(0.1)[1],
            400,
            "TopicDisallowed",
        ),
        (_with(alert(), **{"apns-topic": None}), alert()[1], 400, "MissingTopic"),
        (_with(alert(), **{"apns-push-type": "nonsense"}), alert()[1], 400, "InvalidPushType"),
        (
            _with(live_activity_update(0.1), **{"apns-priority": "1"}),
            live_activity_update(0.1)[1],
            400,
            "BadPriority",
        ),
        (_with(alert(), **{"apns-collapse-id": "x" * 65}), alert()[1], 400, "BadCollapseId"),
        (_with(alert(), **{"apns-expiration": "tomorrow"}), alert()[1], 400, "BadExpirationDate"),
        (alert()[0], {"no": "aps"}, 400, "BadPayload"),
        (alert()[0], b"{not json", 400, "BadPayload"),
        (alert()[0], {"aps": {"alert": "x" * 4100}}, 413, "PayloadTooLarge"),
        (
            live_activity_update(0.1)[0],
            {"aps": {"event": "pause", "timestamp": 1}},
            400,
            "BadLiveActivityEvent",
        ),
        (
            live_activity_update(0.1)[0],
            {"aps": {"event": "update", "timestamp": 1}},
            400,
            "MissingContentState",
        ),
        (
            live_activity_update(0.1)[0],
            {"aps": {"event": "start", "timestamp": 1, "content-state": {}}},
            400,
            "MissingAttributes",
        ),
    ],
)
async def test_headers_and_payloads_are_held_to_apples_rules(
    peer_and_key: tuple[ApnsPeer, ec.EllipticCurvePrivateKey],
    headers: dict[str, str],
    payload: Any,
    status: int,
    reason: str,
) -> None:
    peer, key = peer_and_key
    assert await post(peer, device_token(), headers, payload, provider_token(key)) == (
        status,
        reason,
    )
    assert peer.state.received == []


async def test_errors_are_answered_on_demand_per_token(
    peer_and_key: tuple[ApnsPeer, ec.EllipticCurvePrivateKey],
) -> None:
    peer, key = peer_and_key
    token, other = device_token(), device_token()
    peer.fail(token, 429, "TooManyRequests", times=1)
    headers, payload = alert()
    jwt_value = provider_token(key)
    assert await post(peer, token, headers, payload, jwt_value) == (429, "TooManyRequests")
    assert await post(peer, other, headers, payload, jwt_value) == (200, "")
    assert await post(peer, token, headers, payload, jwt_value) == (200, "")
    assert await post(peer, "zz" * 32, headers, payload, jwt_value) == (400, "BadDeviceToken")


def _peer_beside_wrong_notify_rules(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh copy of the peer's module, loaded while notify's APNs rules say wrong
    things: each one lets through what Apple refuses."""
    wrong = ModuleType(notify_rules.__name__)
    wrong.__dict__.update(vars(notify_rules))
    wrong.__dict__.update(
        COLLAPSE_ID_MAX_BYTES=1000,
        PRIORITIES={"alert": ("10", "5", "1"), "background": ("5", "10"), "liveactivity": ("5",)},
        LIVE_ACTIVITY_EVENTS=("start", "update", "end", "pause"),
        payload_limit=lambda push_type: 1 << 20,
        DUMMY_DEVICE_TOKEN="ff" * 32,
    )
    monkeypatch.setitem(sys.modules, notify_rules.__name__, wrong)
    spec = importlib.util.spec_from_file_location(
        "apns_peer_beside_wrong_rules", apns_peer.__file__
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


async def test_the_peer_holds_apples_rules_whatever_notifys_say(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The peer states Apple's rules itself: were notify's copy wrong, the peer would
    still refuse what Apple refuses (a peer sharing the copy would accept it)."""
    peer_module = _peer_beside_wrong_notify_rules(monkeypatch)
    key_path, public = provider_key(tmp_path / "key")
    peer = peer_module.ApnsPeer(
        peer_module.PeerRules(public, KEY_ID, TEAM_ID, BUNDLE_ID), tmp_path / "peer"
    )
    await peer.start()
    try:
        jwt_value = provider_token(load_signing_key(str(key_path)))
        background = {"apns-push-type": "background", "apns-topic": BUNDLE_ID}
        refused = [
            (_with(alert(), **{"apns-collapse-id": "x" * 65}), alert()[1]),
            ({**background, "apns-priority": "10"}, {"aps": {"content-available": 1}}),
            (alert()[0], {"aps": {"alert": "x" * 4100}}),
            (live_activity_update(0.1)[0], {"aps": {"event": "pause", "timestamp": 1}}),
        ]
        answers = [
            await post(peer, device_token(), headers, payload, jwt_value)
            for headers, payload in refused
        ]
        assert answers == [
            (400, "BadCollapseId"),
            (400, "BadPriority"),
            (413, "PayloadTooLarge"),
            (400, "BadLiveActivityEvent"),
        ]
        # The token Apple never issues stays refused; a real-looking one passes.
        headers, payload = alert()
        assert await post(peer, "00" * 32, headers, payload, jwt_value) == (400, "BadDeviceToken")
        assert await post(peer, "ff" * 32, headers, payload, jwt_value) == (200, "")
        assert len(peer.state.received) == 1
    finally:
        await peer.close()

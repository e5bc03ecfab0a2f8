"""The sender's decisions with a fake store and client (no network): what each answer
writes, the size check before sending, one JWT for a whole batch."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from services.kit.clock import SettableClock
from services.notify.apns.claims import ClaimedPush, Exchange, Outcome
from services.notify.apns.outcomes import Answer
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.sender import Sender
from services.notify.apns.settings import ApnsSettings

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SETTINGS = ApnsSettings(
    enabled=True,
    key_path="",
    key_id="KEYID12345",
    team_id="TEAMID1234",
    bundle_id="a.b",
    max_attempts=3,
    backoff_base_seconds=1,
    backoff_max_seconds=10,
)


def claimed(
    push_id: int,
    *,
    attempt: int = 1,
    push_type: str = "alert",
    size: int = 10,
    registration: str = "active",
    expires_at: datetime | None = None,
) -> ClaimedPush:
    payload = json.dumps({"aps": {"alert": "x" * size}}).encode()
    return ClaimedPush(
        push_id=push_id,
        attempt=attempt,
        kind="alert",
        created_at=NOW,
        expires_at=expires_at,
        headers={"apns-push-type": push_type, "apns-topic": "a.b"},
        payload=payload,
        token_id=uuid.uuid4(),
        token="ab" * 32,
        environment="production",
        token_status=registration,
        claimed_at=NOW,
    )


@dataclass
class FakeStore:
    batch: list[ClaimedPush]
    outcomes: list[Outcome] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    retired: list[Any] = field(default_factory=list)
    bad: list[Any] = field(default_factory=list)

    async def claim(self, limit: int, lease_seconds: float) -> list[ClaimedPush]:
        batch, self.batch = self.batch, []
        return batch

    async def record(self, outcomes: list[Outcome], exchanges: list[Exchange]) -> int:
        self.outcomes += outcomes
        self.exchanges += exchanges
        return len(outcomes)

    async def retire_token(self, token_id: Any, at: datetime | None) -> bool:
        self.retired.append((token_id, at))
        return True

    async def mark_token_bad(self, token_id: Any, reason: str) -> None:
        self.bad.append(token_id)


@dataclass
class FakeClient:
    answers: dict[int, list[tuple[int, str]]]
    jwts: list[str] = field(default_factory=list)
    reconnects: int = 0

    async def send(
        self,
        environment: str,
        device_token: str,
        headers: Any,
        body: bytes,
        apns_id: str,
        provider_token: str,
    ) -> Answer:
        self.jwts.append(provider_token)
        push_id = int(json.loads(body)["aps"]["alert"].count("x"))
        status, reason = self.answers[push_id].pop(0)
        return Answer(status, reason, apns_id)

    def reconnect(self, environment: str, answer: Answer) -> bool:
        self.reconnects += 1
        return True


def sender_for(
    store: FakeStore, client: FakeClient, clock: SettableClock | None = None
) -> tuple[Sender, ProviderToken]:
    clock = clock or SettableClock(NOW)
    token = ProviderToken(
        ec.generate_private_key(ec.SECP256R1()), "KEYID12345", "TEAMID1234", 2400, clock
    )
    return Sender(SETTINGS, store, client, token, clock), token  # type: ignore[arg-type]


async def test_each_answer_becomes_its_outcome() -> None:
    # The fake client tells pushes apart by their payload size (push_id x's).
    store = FakeStore(
        [
            claimed(1, size=1),
            claimed(2, size=2),
            claimed(3, size=3),
            claimed(4, size=4),
            claimed(5, size=5, attempt=3),
        ]
    )
    client = FakeClient(
        {
            1: [(200, "")],
            2: [(410, "Unregistered")],
            3: [(400, "BadDeviceToken")],
            4: [(429, "TooManyRequests")],
            5: [(500, "InternalServerError")],
        }
    )
    sender, token = sender_for(store, client)

    assert await sender.send_due() == 5

    by_id = {o.push_id: o for o in store.outcomes}
    assert (by_id[1].status, by_id[1].sent) == ("sent", True)
    # Sent as of its claim, not of when the answer was recorded.
    assert by_id[1].sent_at == NOW
    assert all(o.sent_at is None for o in store.outcomes if o.push_id != 1)
    assert (by_id[2].status, by_id[2].reason) == ("dropped", "Unregistered")
    assert (by_id[3].status, by_id[3].reason) == ("dropped", "BadDeviceToken")
    assert by_id[4].status == "pending"
    assert by_id[4].next_attempt_at is not None
    assert NOW + timedelta(seconds=0.5) <= by_id[4].next_attempt_at <= NOW + timedelta(seconds=1)
    assert (by_id[5].status, by_id[5].http_status) == ("failed", 500)  # max attempts reached
    assert len(store.retired) == 1
    assert len(store.bad) == 1
    assert len(store.exchanges) == 5
    assert len(set(client.jwts)) == 1 and token.minted == 1  # one JWT for the whole batch


async def test_expired_provider_token_is_refreshed_and_retried_once() -> None:
    store = FakeStore([claimed(1, size=1)])
    client = FakeClient({1: [(403, "ExpiredProviderToken"), (200, "")]})
    clock = SettableClock(NOW - timedelta(minutes=30))
    sender, token = sender_for(store, client, clock)
    token.current()  # minted half an hour ago: old enough to replace
    clock.set(NOW)

    await sender.send_due()

    assert store.outcomes[0].status == "sent"
    assert [e.http_status for e in store.exchanges] == [403, 200]
    assert client.jwts[0] != client.jwts[1]
    assert token.minted == 2


async def test_a_payload_over_the_limit_is_failed_without_a_request() -> None:
    store = FakeStore([claimed(1, push_type="liveactivity", size=4097)])
    client = FakeClient({})
    sender, _ = sender_for(store, client)

    await sender.send_due()

    assert (store.outcomes[0].status, store.outcomes[0].reason) == ("failed", "PayloadTooLarge")
    assert client.jwts == []


async def test_pushes_of_inactive_tokens_or_past_expiry_are_dropped_unsent() -> None:
    store = FakeStore(
        [claimed(1, registration="retired"), claimed(2, expires_at=NOW - timedelta(seconds=1))]
    )
    client = FakeClient({})
    sender, _ = sender_for(store, client)

    await sender.send_due()

    assert [(o.status, o.reason) for o in store.outcomes] == [
        ("dropped", "TokenRetired"),
        ("dropped", "Expired"),
    ]
    assert client.jwts == []


async def test_a_credential_refusal_holds_the_push_past_max_attempts_until_the_bound() -> None:
    store = FakeStore([claimed(1, size=1, attempt=3)])  # at max_attempts
    client = FakeClient({1: [(403, "InvalidProviderToken")]})
    sender, _ = sender_for(store, client)

    await sender.send_due()

    assert (store.outcomes[0].status, store.outcomes[0].reason) == (
        "pending",
        "InvalidProviderToken",
    )
    old = claimed(2, size=2, attempt=50)
    store.batch = [
        replace(old, created_at=NOW - timedelta(seconds=SETTINGS.credentials_hold_seconds))
    ]
    client.answers[2] = [(403, "InvalidProviderToken")]
    await sender.send_due()
    assert (store.outcomes[1].status, store.outcomes[1].reason) == (
        "failed",
        "InvalidProviderToken",
    )


async def test_a_refused_token_update_reconnects_and_keeps_the_token() -> None:
    store = FakeStore([claimed(1, size=1, attempt=3)])
    client = FakeClient({1: [(429, "TooManyProviderTokenUpdates")]})
    sender, token = sender_for(store, client)

    await sender.send_due()

    assert (store.outcomes[0].status, store.outcomes[0].reason) == (
        "pending",
        "TooManyProviderTokenUpdates",
    )
    assert client.reconnects == 1
    assert token.minted == 1

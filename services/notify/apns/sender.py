"""The sender: drains notify.pushes to APNs. Several replicas may run side by side.

Each round claims a batch (SKIP LOCKED, leased by bumping next_attempt_at), sends it
outside any transaction over HTTP/2, then records every exchange and outcome in one
statement. Duplicates are bounded by the lease: a push is sent again only if its sender
stopped between sending and recording (a crash, a lost database) and then no sooner than
``lease_seconds`` later, with the same apns-id, so the resend is recognisable. Requests
time out well inside the lease, so a live sender always records before its lease ends.
While APNs refuses our credentials (a configuration error, or a token update it refused
on a connection) pushes are held, not failed: no push could go until that is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import timedelta

from prometheus_client import Counter, Gauge

from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger
from services.notify.apns.claims import ClaimedPush, Exchange, Outcome
from services.notify.apns.client import ApnsClient, apns_id_for
from services.notify.apns.outcomes import (
    REFUSES_CREDENTIALS,
    Answer,
    Next,
    backoff_seconds,
    decide,
)
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.refusals import setting_at_fault
from services.notify.apns.rules import payload_limit, reason_label, token_tail
from services.notify.apns.settings import ApnsSettings
from services.notify.store.sender import PushStore

log = get_logger(__name__)

# A push round's outcome, as the store records it (Outcome.status).
OUTCOMES = ("sent", "dropped", "failed", "pending")
PUSHES = Counter(
    "atelier_apns_pushes_total",
    "Push rounds by outcome (sent, dropped, failed; pending: to be sent again) and reason "
    "(Apple's, or the sender's own: Timeout, ConnectionLost, Expired, TokenRetired, ...)",
    ["outcome", "reason"],
)
EXCHANGES = Counter("atelier_apns_requests_total", "HTTP exchanges with APNs by status", ["status"])
BAD_DEVICE_TOKENS = Counter(
    "atelier_apns_bad_device_token_total",
    "400 BadDeviceToken answers, by the token's stored environment; most are a "
    "sandbox/production mismatch (TestFlight builds use production)",
    ["environment", "likely_cause"],
)

CREDENTIALS_REFUSED = Gauge(
    "atelier_apns_credentials_refused",
    "1 while APNs refuses this sender's credentials on an environment's host for this "
    "reason (its pushes are held, pending, until ATELIER_APNS_CREDENTIALS_HOLD), 0 once "
    "it accepts them again",
    ["environment", "reason"],
)
_REFUSAL_REASONS = sorted({reason for _, reason in REFUSES_CREDENTIALS})
# Steps after which a push waits for our credentials instead of failing: a refusal of our
# configuration, an expired token not refreshed (too young to replace), a token update
# refused on a connection (a new one is opened).
_HELD = (Next.HOLD, Next.REFRESH_TOKEN, Next.RECONNECT)
# The alert log line repeats at most this often per environment and reason.
_REFUSAL_LOG_SECONDS = 60.0

# The longest a sender waits between rounds while they fail.
_MAX_PAUSE_SECONDS = 10.0

# Why a push to a token that is no longer active was dropped unsent (as the store says it).
_INACTIVE_REASONS = {"retired": "TokenRetired", "bad": "TokenBad"}


@dataclass
class _Sent:
    """What one push's round produced: the outcome, its exchanges, a token action."""

    outcome: Outcome
    exchanges: list[Exchange] = field(default_factory=list)
    retire_at: Answer | None = None
    bad_token: bool = False


class Sender:
    name = "apns-sender"

    def __init__(
        self,
        settings: ApnsSettings,
        store: PushStore,
        client: ApnsClient,
        provider_token: ProviderToken,
        clock: Clock = system_clock,
    ) -> None:
        self._settings = settings
        self._store = store
        self._client = client
        self._token = provider_token
        self._clock = clock
        self._stopping = asyncio.Event()
        # (environment, reason) → when the refusal was last logged.
        self._refused: dict[tuple[str, str], float] = {}

    async def run(self) -> None:
        pause = self._settings.poll_seconds
        while not self._stopping.is_set():
            try:
                handled = await self.send_due()
            except Exception as error:
                # The database is away (or the schema not there yet): the pushes wait in
                # the table, so wait too, longer each time, instead of stopping notify.
                log.warning("apns_round_failed", error=type(error).__name__, retry_in=pause)
                handled = 0
                pause = min(pause * 2, _MAX_PAUSE_SECONDS)
            else:
                pause = self._settings.poll_seconds
            if handled < self._settings.batch_size:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause)

    async def stop(self, deadline: float) -> None:
        # The round in flight finishes (its sends are short and time out inside the lease).
        self._stopping.set()

    async def send_due(self) -> int:
        """One round: claim, send, record. Returns how many pushes it claimed."""
        claimed = await self._store.claim(self._settings.batch_size, self._settings.lease_seconds)
        if not claimed:
            return 0
        results = await asyncio.gather(*(self._send_one(push) for push in claimed))
        await self._store.record(
            [r.outcome for r in results], [e for r in results for e in r.exchanges]
        )
        for push, result in zip(claimed, results, strict=True):
            await self._act_on_token(push, result)
            PUSHES.labels(result.outcome.status, reason_label(result.outcome.reason)).inc()
        return len(claimed)

    async def _send_one(self, push: ClaimedPush) -> _Sent:
        apns_id = apns_id_for(push.push_id)
        now = self._clock()
        if push.token_status != "active":
            reason = _INACTIVE_REASONS.get(push.token_status, "TokenInactive")
            return _Sent(self._final(push, "dropped", None, None, reason))
        if push.expires_at is not None and push.expires_at <= now:
            return _Sent(self._final(push, "dropped", None, None, "Expired"))
        push_type = push.headers.get("apns-push-type", "alert")
        if len(push.payload) > payload_limit(push_type):
            log.error(
                "apns_payload_too_large",
                push_id=push.push_id,
                size=len(push.payload),
                limit=payload_limit(push_type),
            )
            return _Sent(self._final(push, "failed", None, None, "PayloadTooLarge"))
        exchanges: list[Exchange] = []
        jwt = self._token.current()
        answer = await self._exchange(push, apns_id, jwt, exchanges)
        if decide(answer) is Next.REFRESH_TOKEN:
            fresh = self._token.rejected(jwt)
            log.warning(
                "apns_provider_token_expired", push_id=push.push_id, refreshed=fresh is not None
            )
            if fresh is not None:
                answer = await self._exchange(push, apns_id, fresh, exchanges)
        if decide(answer) is Next.RECONNECT and self._client.reconnect(push.environment, answer):
            log.warning(
                "apns_token_update_refused",
                environment=push.environment,
                then="a new connection takes the current token",
            )
        self._watch_credentials(push.environment, answer)
        return self._conclude(push, answer, exchanges)

    async def _exchange(
        self, push: ClaimedPush, apns_id: str, jwt: str, exchanges: list[Exchange]
    ) -> Answer:
        answer = await self._client.send(
            push.environment, push.token, push.headers, push.payload, apns_id, jwt
        )
        EXCHANGES.labels(str(answer.status)).inc()
        exchanges.append(
            Exchange(
                push.push_id,
                push.attempt,
                answer.apns_id,
                answer.status,
                answer.reason,
                self._clock(),
            )
        )
        return answer

    def _conclude(self, push: ClaimedPush, answer: Answer, exchanges: list[Exchange]) -> _Sent:
        next_step = decide(answer)
        if next_step is Next.SENT:
            outcome = self._final(push, "sent", answer, answer.apns_id, None, sent=True)
            return _Sent(outcome, exchanges)
        if next_step is Next.RETIRE_TOKEN:
            return _Sent(
                self._final(push, "dropped", answer, answer.apns_id, answer.reason),
                exchanges,
                retire_at=answer,
            )
        if next_step is Next.BAD_TOKEN:
            other = "sandbox" if push.environment == "production" else "production"
            log.warning(
                "apns_bad_device_token",
                push_id=push.push_id,
                device=token_tail(push.token),
                environment=push.environment,
                likely_cause="environment_mismatch",
                hint=f"registered as {push.environment}; the app build most likely uses "
                f"{other} (TestFlight, App Store and Ad Hoc builds use production)",
            )
            BAD_DEVICE_TOKENS.labels(push.environment, "environment_mismatch").inc()
            return _Sent(
                self._final(push, "dropped", answer, answer.apns_id, answer.reason),
                exchanges,
                bad_token=True,
            )
        if next_step in _HELD:
            return self._hold(push, answer, exchanges)
        if next_step is Next.FAIL or push.attempt >= self._settings.max_attempts:
            log.warning(
                "apns_push_failed",
                push_id=push.push_id,
                status=answer.status,
                reason=answer.reason,
                attempts=push.attempt,
            )
            return _Sent(
                self._final(push, "failed", answer, answer.apns_id, answer.reason), exchanges
            )
        return _Sent(self._later(push, answer), exchanges)

    def _later(self, push: ClaimedPush, answer: Answer) -> Outcome:
        delay = backoff_seconds(
            push.attempt, self._settings.backoff_base_seconds, self._settings.backoff_max_seconds
        )
        return Outcome(
            push.push_id,
            push.attempt,
            "pending",
            answer.apns_id,
            answer.status,
            answer.reason,
            next_attempt_at=self._clock() + timedelta(seconds=delay),
        )

    def _hold(self, push: ClaimedPush, answer: Answer, exchanges: list[Exchange]) -> _Sent:
        """APNs refuses our credentials, not this push: it waits, however many attempts
        that takes, until the hold's bound after it was planned."""
        held = (self._clock() - push.created_at).total_seconds()
        if held < self._settings.credentials_hold_seconds:
            return _Sent(self._later(push, answer), exchanges)
        log.error(
            "apns_push_failed",
            push_id=push.push_id,
            status=answer.status,
            reason=answer.reason,
            attempts=push.attempt,
            held_seconds=round(held),
            why="APNs refused our credentials for longer than ATELIER_APNS_CREDENTIALS_HOLD",
        )
        return _Sent(self._final(push, "failed", answer, answer.apns_id, answer.reason), exchanges)

    def _watch_credentials(self, environment: str, answer: Answer) -> None:
        """Sets the gauge and writes the alert log line while APNs refuses our credentials;
        clears both once an answer shows it took them."""
        if (answer.status, answer.reason) in REFUSES_CREDENTIALS:
            CREDENTIALS_REFUSED.labels(environment, answer.reason).set(1)
            now = self._clock().timestamp()
            last = self._refused.get((environment, answer.reason))
            if last is None or now - last >= _REFUSAL_LOG_SECONDS:
                self._refused[(environment, answer.reason)] = now
                log.error(
                    "apns_credentials_refused",
                    environment=environment,
                    status=answer.status,
                    reason=answer.reason,
                    at_fault=setting_at_fault(answer.reason),
                    pushes="held pending, retried with backoff, until "
                    "ATELIER_APNS_CREDENTIALS_HOLD after they were planned",
                    check="atelier push doctor",
                )
            return
        if answer.status in (0, 429) or answer.status >= 500:
            return  # says nothing about our credentials
        for reason in _REFUSAL_REASONS:
            CREDENTIALS_REFUSED.labels(environment, reason).set(0)
        cleared = [key for key in self._refused if key[0] == environment]
        for key in cleared:
            del self._refused[key]
        if cleared:
            log.info("apns_credentials_accepted", environment=environment)

    def _final(
        self,
        push: ClaimedPush,
        status: str,
        answer: Answer | None,
        apns_id: str | None,
        reason: str | None,
        *,
        sent: bool = False,
    ) -> Outcome:
        return Outcome(
            push.push_id,
            push.attempt,
            status,
            apns_id,
            answer.status if answer is not None else None,
            reason,
            sent=sent,
            sent_at=push.claimed_at if sent else None,
        )

    async def _act_on_token(self, push: ClaimedPush, result: _Sent) -> None:
        if result.retire_at is not None:
            retired = await self._store.retire_token(
                push.token_id, result.retire_at.unregistered_at
            )
            log.info(
                "apns_token_retired" if retired else "apns_token_kept_reregistered",
                push_id=push.push_id,
                device=token_tail(push.token),
            )
        elif result.bad_token:
            await self._store.mark_token_bad(push.token_id, "BadDeviceToken")

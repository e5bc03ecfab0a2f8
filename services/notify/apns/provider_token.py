"""The ES256 provider token: one JWT per team, reused until it is ``refresh_seconds`` old
(Apple refuses tokens older than an hour and throttles refreshing more often than every
20 minutes), never minted per request."""

from __future__ import annotations

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from services.kit.clock import Clock, system_clock

# APNs answers 429 TooManyProviderTokenUpdates to a token that replaces one younger than
# this: never mint more often, whatever it answered.
MIN_REFRESH_SECONDS = 1200.0


class ProviderToken:
    def __init__(
        self,
        key: ec.EllipticCurvePrivateKey,
        key_id: str,
        team_id: str,
        refresh_seconds: float,
        clock: Clock = system_clock,
    ) -> None:
        self._key = key
        self._key_id = key_id
        self._team_id = team_id
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._token = ""
        self._issued_at = 0.0
        # How many tokens were minted: tests and metrics see reuse.
        self.minted = 0

    def current(self) -> str:
        now = self._clock().timestamp()
        if not self._token or now - self._issued_at >= self._refresh_seconds:
            self._mint(now)
        return self._token

    def rejected(self, token: str) -> str | None:
        """Apple answered ExpiredProviderToken to ``token``: the token to retry with (a new
        one, minted once however many requests saw the rejection), or None when ``token``
        is still the current one and too young to replace (the clock is off: the push
        waits rather than provoke TooManyProviderTokenUpdates)."""
        if token != self._token:
            return self._token
        now = self._clock().timestamp()
        if now - self._issued_at < MIN_REFRESH_SECONDS:
            return None
        self._mint(now)
        return self._token

    def _mint(self, now: float) -> None:
        issued_at = int(now)
        self._token = jwt.encode(
            {"iss": self._team_id, "iat": issued_at},
            self._key,
            algorithm="ES256",
            headers={"kid": self._key_id},
        )
        self._issued_at = float(issued_at)
        self.minted += 1

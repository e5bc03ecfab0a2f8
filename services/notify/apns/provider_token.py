"""The ES256 provider token: one JWT per team, reused until it is ``refresh_seconds`` old
(Apple refuses tokens older than an hour and throttles refreshing more often than every
20 minutes), never minted per request."""

from __future__ import annotations

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from services.kit.clock import Clock, system_clock


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

    def rejected(self, token: str) -> str:
        """Apple answered ExpiredProviderToken to ``token``: mint a new one unless another
        request already did, and return the one to retry with."""
        if token == self._token:
            self._mint(self._clock().timestamp())
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

"""Who is calling: end users with a JWT bearer token on public listeners, our own services
with a shared service credential on internal listeners."""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jwt

from services.kit.errors import Reason, unauthenticated
from services.kit.token_cache import VerifiedTokens

Metadata = Sequence[tuple[str, str | bytes]]

JWT_ALGORITHM = "HS256"
# Tolerated clock difference between the token issuer and us.
CLOCK_SKEW_SECONDS = 30
# The longest a token may be valid when nothing else is configured.
DEFAULT_MAX_LIFETIME_SECONDS = 24 * 3600

# One rule for a user id, whoever stores it: ids end up in every service's rows (media's
# CHECK allows 1-256 characters) and in logs, so they are short, printable ASCII, and
# never hold a NUL, a space or a control character.
MAX_PRINCIPAL_ID_LENGTH = 128
_PRINCIPAL_ID = re.compile(r"[A-Za-z0-9._:@|+\-]+")
PRINCIPAL_ID_RULE = (
    f"must be 1-{MAX_PRINCIPAL_ID_LENGTH} characters of letters, digits and . _ : @ | + -"
)


def principal_id_problem(value: str) -> str | None:
    """Why ``value`` is not an acceptable user id, or None when it is."""
    if not 0 < len(value) <= MAX_PRINCIPAL_ID_LENGTH or not _PRINCIPAL_ID.fullmatch(value):
        return PRINCIPAL_ID_RULE
    return None


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. ``user_id`` is empty for service callers and for remote
    workers, which carry their pool's name instead."""

    user_id: str
    is_service: bool = False
    worker_pool: str = ""


_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "atelier_principal", default=None
)


def current_principal() -> Principal:
    """The caller of the RPC being handled; the auth interceptor sets it first."""
    principal = _current.get()
    if principal is None:
        raise RuntimeError("no principal: the handler ran outside the auth interceptor")
    return principal


def set_principal(principal: Principal) -> contextvars.Token[Principal | None]:
    return _current.set(principal)


def reset_principal(token: contextvars.Token[Principal | None]) -> None:
    _current.reset(token)


class Authenticator(Protocol):
    def authenticate(self, metadata: Metadata) -> Principal:
        """Returns the caller or raises ApiError(UNAUTHENTICATED)."""
        ...


def _bearer(metadata: Metadata) -> str | None:
    """The bearer credential, None when there is no authorization header at all."""
    for key, value in metadata:
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, credential = text.strip().partition(" ")
            if scheme.lower() != "bearer" or not credential.strip():
                return ""
            return credential.strip()
    return None


@dataclass(frozen=True)
class JwtAuthenticator:
    """Checks an HS256 JWT: signature, expiry, issuer, audience, a lifetime no longer than
    ``max_lifetime_seconds`` (a leaked token must not stay valid for years) and a subject
    that follows the principal-id rule.

    A token that passed is remembered until its ``exp`` (see
    :class:`~services.kit.token_cache.VerifiedTokens`): clients send the same one on
    every call."""

    secret: str
    issuer: str
    audience: str
    max_lifetime_seconds: float = DEFAULT_MAX_LIFETIME_SECONDS
    verified: VerifiedTokens[Principal] = field(
        default_factory=VerifiedTokens, compare=False, repr=False
    )

    def authenticate(self, metadata: Metadata) -> Principal:
        token = _bearer(metadata)
        if token is None:
            raise unauthenticated(
                Reason.TOKEN_MISSING, "an authorization: Bearer token is required"
            )
        if token == "":
            raise unauthenticated(
                Reason.TOKEN_MALFORMED, "the authorization header must be 'Bearer <token>'"
            )
        principal = self.verified.get(token)
        if principal is None:
            principal, expires_at = self._verify(token)
            self.verified.put(token, principal, expires_at)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        """The token's principal and its ``exp``, or ApiError(UNAUTHENTICATED)."""
        try:
            claims = jwt.decode(
                token,
                self.secret,
                algorithms=[JWT_ALGORITHM],
                audience=self.audience,
                issuer=self.issuer,
                leeway=CLOCK_SKEW_SECONDS,
                options={"require": ["exp", "iat", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise unauthenticated(Reason.TOKEN_EXPIRED, "the token has expired") from None
        except jwt.InvalidSignatureError:
            raise unauthenticated(
                Reason.TOKEN_INVALID, "the token signature does not verify"
            ) from None
        except jwt.DecodeError:
            raise unauthenticated(Reason.TOKEN_MALFORMED, "the token is not a valid JWT") from None
        except jwt.InvalidTokenError as exc:
            raise unauthenticated(Reason.TOKEN_INVALID, _claim_problem(exc)) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip():
            raise unauthenticated(Reason.TOKEN_INVALID, "the token has no subject")
        if principal_id_problem(subject) is not None:
            # The subject itself is not echoed: it may be anything, NUL included.
            raise unauthenticated(Reason.TOKEN_INVALID, f"the token's subject {PRINCIPAL_ID_RULE}")
        self._check_lifetime(claims)
        return Principal(user_id=subject), float(claims["exp"])

    def _check_lifetime(self, claims: dict[str, Any]) -> None:
        # pyjwt checked that exp and iat are numbers and that iat is not in the future.
        if float(claims["exp"]) - float(claims["iat"]) > self.max_lifetime_seconds:
            raise unauthenticated(
                Reason.TOKEN_INVALID,
                f"the token is valid for longer than {self.max_lifetime_seconds:g} seconds",
            )


def _claim_problem(exc: jwt.InvalidTokenError) -> str:
    if isinstance(exc, jwt.InvalidAudienceError):
        return "the token is for another audience"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "the token is from another issuer"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"the token lacks the {exc.claim!r} claim"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "the token is not valid yet"
    return "the token is not acceptable"


@dataclass(frozen=True)
class ServiceAuthenticator:
    """Checks the shared service credential that internal callers send as a bearer token."""

    service_token: str

    def authenticate(self, metadata: Metadata) -> Principal:
        credential = _bearer(metadata)
        if credential is None:
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_MISSING, "internal RPCs need the service credential"
            )
        if not hmac.compare_digest(credential.encode(), self.service_token.encode()):
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_INVALID, "the service credential is not valid"
            )
        return Principal(user_id="", is_service=True)


@dataclass(frozen=True)
class WorkerPoolAuthenticator:
    """Checks a worker pool's credential (a bearer token); the pools are known only by the
    SHA-256 of their credentials, so the settings hold no secret."""

    pools_by_hash: dict[str, str]

    def authenticate(self, metadata: Metadata) -> Principal:
        credential = _bearer(metadata)
        if credential is None:
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_MISSING, "worker calls need the pool's credential"
            )
        pool = self.pools_by_hash.get(credential_hash(credential))
        if pool is None:
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_INVALID, "the worker pool credential is not valid"
            )
        return Principal(user_id="", worker_pool=pool)


def credential_hash(credential: str) -> str:
    """How a worker pool's credential is kept in settings: its SHA-256, in hex."""
    return hashlib.sha256(credential.encode()).hexdigest()


@dataclass(frozen=True)
class RoutedAuthenticator:
    """One listener, several kinds of caller: the methods under a prefix (a service's
    full name) take that prefix's authenticator, every other method the default. A
    credential good for one kind is refused by the others (a worker pool cannot call
    admin RPCs; the service credential cannot claim jobs)."""

    default: Authenticator
    by_prefix: dict[str, Authenticator]

    def for_method(self, method: str) -> Authenticator:
        for prefix, authenticator in self.by_prefix.items():
            if method.startswith(prefix):
                return authenticator
        return self.default

    def authenticate(self, metadata: Metadata) -> Principal:
        return self.default.authenticate(metadata)


def issue_token(
    secret: str,
    issuer: str,
    audience: str,
    user_id: str,
    ttl_seconds: int,
    now: float | None = None,
) -> str:
    """Signs a user token; used by `atelier token` and tests (a real deployment's identity
    provider issues them). Callers that face users check the TTL against the services'
    maximum lifetime first (see :func:`lifetime_problem`)."""
    issued = int(time.time() if now is None else now)
    claims = {
        "sub": user_id,
        "iss": issuer,
        "aud": audience,
        "iat": issued,
        "exp": issued + ttl_seconds,
    }
    return jwt.encode(claims, secret, algorithm=JWT_ALGORITHM)


def lifetime_problem(ttl_seconds: float, max_lifetime_seconds: float) -> str | None:
    """Why a token with this TTL would be refused by services with this maximum."""
    if ttl_seconds <= 0:
        return "must be a positive number of seconds"
    if ttl_seconds > max_lifetime_seconds:
        return (
            f"must be at most {max_lifetime_seconds:g} seconds "
            "(ATELIER_JWT_MAX_LIFETIME); the services refuse longer-lived tokens"
        )
    return None

"""Who is calling: end users with a JWT bearer token on public listeners, our own services
with a shared service credential on internal listeners.

A user token is either signed by a trusted issuer (the app's identity provider:
RS256 / ES256 / EdDSA with a key from its JWKS, see :mod:`services.kit.jwks`) or, for
`make dev` and deployments that mint their own, HS256 with ``ATELIER_JWT_SECRET``. The
token's ``iss`` picks the way; a token never chooses its own algorithm outside its
issuer's allow-list."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import grpc
import jwt

from services.kit.errors import ApiError, Reason, clip, unauthenticated
from services.kit.identities import ServiceIdentity, holder
from services.kit.issuers import TrustedIssuer
from services.kit.jwks import IssuerKeys, KeySource
from services.kit.outages import RETRY_AFTER_SECONDS
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
    workers, which carry their pool's name instead. ``identity`` names the calling
    service identity (ATELIER_SERVICE_IDENTITIES; empty for the shared
    ATELIER_SERVICE_TOKEN and for users); with a ``user_id`` too, that identity acts for
    the user (on-behalf-of)."""

    user_id: str
    is_service: bool = False
    worker_pool: str = ""
    identity: str = ""
    # The identity's role ("operator", "creation", ...); empty without an identity.
    role: str = ""

    @property
    def operator_name(self) -> str:
        """The operator this caller is, "" when it is not a named operator identity."""
        return self.identity if self.role == "operator" else ""


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


@runtime_checkable
class MethodAuthenticator(Protocol):
    """An authenticator whose answer depends on the method called (a policy per RPC):
    the server stack asks it once per method for that method's authenticator."""

    def for_method(self, method: str) -> Authenticator: ...


def authenticator_for(authenticator: Authenticator, method: str) -> Authenticator:
    """The authenticator that checks calls of ``method``."""
    while isinstance(authenticator, MethodAuthenticator):
        chosen = authenticator.for_method(method)
        if chosen is authenticator:
            break
        authenticator = chosen
    return authenticator


def bearer_credential(metadata: Metadata) -> str | None:
    """The bearer credential, "" for a malformed header, None without one."""
    return _bearer(metadata)


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


class KeysPending(Exception):
    """The answer waits on a refresh of an issuer's key set that is under way (a token
    names a key we do not hold yet, or the keys are being fetched for the first time).
    The server stack awaits :meth:`wait` and authenticates once more; if that asks to
    wait again, ``otherwise`` is the answer."""

    def __init__(self, refresh: asyncio.Task[bool], otherwise: ApiError) -> None:
        super().__init__("waiting for the issuer's key set")
        self.refresh = refresh
        self.otherwise = otherwise

    async def wait(self) -> None:
        # Shielded: the refresh is shared, a caller that gives up must not cancel it.
        with contextlib.suppress(Exception):
            await asyncio.shield(self.refresh)


def keys_unavailable() -> ApiError:
    return ApiError(
        grpc.StatusCode.UNAVAILABLE,
        Reason.IDENTITY_PROVIDER_UNAVAILABLE,
        "the signing keys of the token's issuer cannot be fetched now; try again",
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )


@dataclass(frozen=True)
class JwtAuthenticator:
    """Checks a user JWT: signature, expiry (and ``nbf`` / ``iat`` not in the future),
    issuer, audience, a lifetime no longer than ``max_lifetime_seconds`` (a leaked token
    must not stay valid for years) and a subject that follows the principal-id rule.

    Tokens whose ``iss`` is one of ``keys``' trusted issuers are checked with that
    issuer's keys and algorithms; any other token is HS256 with ``secret`` for
    ``issuer`` (an empty ``secret`` turns HS256 off).

    A token that passed is remembered until its ``exp`` (see
    :class:`~services.kit.token_cache.VerifiedTokens`): clients send the same one on
    every call. The memory is cleared when an issuer's key set loses a key."""

    secret: str
    issuer: str
    audience: str
    max_lifetime_seconds: float = DEFAULT_MAX_LIFETIME_SECONDS
    verified: VerifiedTokens[Principal] = field(
        default_factory=VerifiedTokens, compare=False, repr=False
    )
    keys: IssuerKeys | None = field(default=None, compare=False, repr=False)

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
        """The token's principal and its ``exp``, or ApiError(UNAUTHENTICATED), or
        KeysPending."""
        if self.keys is None:
            return self._verify_self_minted(token)
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise unauthenticated(Reason.TOKEN_MALFORMED, "the token is not a valid JWT") from None
        claimed_issuer = unverified.get("iss")
        source = (
            self.keys.by_issuer.get(claimed_issuer) if isinstance(claimed_issuer, str) else None
        )
        if source is not None:
            return self._verify_issued(token, header, source)
        self_minted = claimed_issuer == self.issuer or header.get("alg") == JWT_ALGORITHM
        if not self.secret or not self_minted:
            raise unauthenticated(Reason.TOKEN_INVALID, "the token is from an untrusted issuer")
        return self._verify_self_minted(token)

    def _verify_self_minted(self, token: str) -> tuple[Principal, float]:
        if not self.secret:
            # HS256 off: an empty key must never verify a token HMAC'd with one.
            raise unauthenticated(Reason.TOKEN_INVALID, "the token is from an untrusted issuer")
        claims = _decode(token, self.secret, [JWT_ALGORITHM], [self.audience], self.issuer)
        return self._principal(claims, str), float(claims["exp"])

    def _verify_issued(
        self, token: str, header: dict[str, Any], source: KeySource
    ) -> tuple[Principal, float]:
        trusted = source.issuer
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in trusted.algorithms:
            # `none`, HS256 signed with the public key, and any algorithm the issuer does
            # not use are refused before any key is looked at.
            shown = clip(algorithm, 16) if isinstance(algorithm, str) else "missing"
            raise unauthenticated(
                Reason.TOKEN_INVALID, f"the token's algorithm ({shown}) is not accepted"
            )
        kid = header.get("kid")
        if kid is not None and (not isinstance(kid, str) or not kid):
            raise unauthenticated(Reason.TOKEN_INVALID, "the token's kid is not a key id")
        keys = source.keys()
        if keys is None:
            pending = source.pending()
            if pending is not None:
                raise KeysPending(pending, keys_unavailable())
            raise keys_unavailable()
        if kid is None:
            # OIDC lets an issuer with a single key leave kid out; a rotated key then
            # shows as a signature that does not verify, which may refresh like an
            # unknown kid (within the same bound).
            if len(keys) != 1:
                raise unauthenticated(Reason.TOKEN_INVALID, "the token names no signing key (kid)")
            (only,) = keys.values()
            try:
                return self._verify_with(token, algorithm, only, trusted)
            except ApiError as refused:
                if refused.message != _BAD_SIGNATURE:
                    raise
                pending = source.refresh_for_unknown_kid()
                if pending is not None:
                    raise KeysPending(pending, refused) from None
                raise
        key = keys.get(kid)
        if key is None:
            unknown = unauthenticated(Reason.TOKEN_INVALID, "unknown signing key")
            pending = source.refresh_for_unknown_kid()
            if pending is not None:
                raise KeysPending(pending, unknown)
            raise unknown
        return self._verify_with(token, algorithm, key, trusted)

    def _verify_with(
        self, token: str, algorithm: str, key: jwt.PyJWK, trusted: TrustedIssuer
    ) -> tuple[Principal, float]:
        if key.algorithm_name != algorithm:
            raise unauthenticated(
                Reason.TOKEN_INVALID, "the signing key is not one for the token's algorithm"
            )
        claims = _decode(token, key.key, [algorithm], list(trusted.audiences), trusted.issuer)
        return self._principal(claims, trusted.user_id), float(claims["exp"])

    def _principal(self, claims: dict[str, Any], user_id_of: Callable[[str], str]) -> Principal:
        """The principal a verified token names: its issuer's name for ``sub``."""
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip():
            raise unauthenticated(Reason.TOKEN_INVALID, "the token has no subject")
        user_id = user_id_of(subject)
        if principal_id_problem(user_id) is not None:
            # The subject itself is not echoed: it may be anything, NUL included.
            raise unauthenticated(Reason.TOKEN_INVALID, f"the token's subject {PRINCIPAL_ID_RULE}")
        self._check_lifetime(claims)
        return Principal(user_id=user_id)

    def _check_lifetime(self, claims: dict[str, Any]) -> None:
        # pyjwt checked that exp and iat are numbers and that iat is not in the future.
        if float(claims["exp"]) - float(claims["iat"]) > self.max_lifetime_seconds:
            raise unauthenticated(
                Reason.TOKEN_INVALID,
                f"the token is valid for longer than {self.max_lifetime_seconds:g} seconds",
            )


_BAD_SIGNATURE = "the token signature does not verify"


def _decode(
    token: str, key: Any, algorithms: list[str], audiences: list[str], issuer: str
) -> dict[str, Any]:
    """The verified claims, or ApiError(UNAUTHENTICATED) with the refusal's reason."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=algorithms,
            audience=audiences,
            issuer=issuer,
            leeway=CLOCK_SKEW_SECONDS,
            options={"require": ["exp", "iat", "sub"]},
        )
    except jwt.ExpiredSignatureError:
        raise unauthenticated(Reason.TOKEN_EXPIRED, "the token has expired") from None
    except jwt.InvalidSignatureError:
        raise unauthenticated(Reason.TOKEN_INVALID, "the token signature does not verify") from None
    except jwt.DecodeError:
        raise unauthenticated(Reason.TOKEN_MALFORMED, "the token is not a valid JWT") from None
    except jwt.InvalidTokenError as exc:
        raise unauthenticated(Reason.TOKEN_INVALID, _claim_problem(exc)) from None
    except jwt.PyJWTError:
        # A key PyJWT will not use for this token: refused, never INTERNAL.
        raise unauthenticated(Reason.TOKEN_INVALID, "the token is not acceptable") from None
    return claims


def _claim_problem(exc: jwt.InvalidTokenError) -> str:
    if isinstance(exc, jwt.InvalidAudienceError):
        return "the token is for another audience"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "the token is from another issuer"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"the token lacks the {exc.claim!r} claim"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "the token is not valid yet"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return "the token's algorithm is not accepted"
    return "the token is not acceptable"


@dataclass(frozen=True)
class ServiceAuthenticator:
    """Checks an internal caller's bearer credential: one of ``identities`` (known by the
    SHA-256 of their credentials, each allowed the RPCs its policy names) or the shared
    ``service_token`` (ATELIER_SERVICE_TOKEN; "" turns it off), which may call every
    internal RPC.

    :meth:`for_method` gives the authenticator of one method (the server stack asks once
    per method); :meth:`authenticate` alone knows no method, so it admits the shared
    credential only."""

    service_token: str
    identities: tuple[ServiceIdentity, ...] = ()

    def for_method(self, method: str) -> Authenticator:
        return _MethodGate(self, method)

    def authenticate(self, metadata: Metadata) -> Principal:
        return self.check(metadata, "")

    def identify(self, credential: str) -> ServiceIdentity | None:
        return holder(self.identities, credential)

    def check(self, metadata: Metadata, method: str) -> Principal:
        credential = _bearer(metadata)
        if credential is None:
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_MISSING, "internal RPCs need the service credential"
            )
        if (
            credential
            and self.service_token
            and hmac.compare_digest(credential.encode(), self.service_token.encode())
        ):
            return Principal(user_id="", is_service=True)
        identity = self.identify(credential) if credential else None
        if identity is None:
            raise unauthenticated(
                Reason.SERVICE_CREDENTIAL_INVALID, "the service credential is not valid"
            )
        if not identity.may_call(method):
            raise rpc_not_permitted(identity.name, method)
        return Principal(user_id="", is_service=True, identity=identity.name, role=identity.role)


@dataclass(frozen=True)
class _MethodGate:
    """:class:`ServiceAuthenticator` for the calls of one method."""

    services: ServiceAuthenticator
    method: str

    def authenticate(self, metadata: Metadata) -> Principal:
        return self.services.check(metadata, self.method)


def rpc_not_permitted(identity: str, method: str) -> ApiError:
    # The identity and method, never the credential.
    shown = clip(method, 200) or "this RPC"
    return ApiError(
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.RPC_NOT_PERMITTED,
        f"the identity {identity!r} may not call {shown}",
        metadata={"identity": identity, "method": clip(method, 200)},
    )


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
    """How a credential (a worker pool's, a service identity's) is kept in settings: its
    SHA-256, in hex."""
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
                return authenticator_for(authenticator, method)
        return authenticator_for(self.default, method)

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

"""Trusted identity providers (``ATELIER_JWT_ISSUERS``): who may sign user tokens with an
asymmetric key, for which audience, with which algorithms, and how their users are named.

The value is a JSON list, one object per issuer::

    [{"issuer": "https://appleid.apple.com", "audience": "com.example.app",
      "algorithms": ["RS256"], "namespace": "apple"}]

``jwks_url`` may be given; without it the key set's address comes from the issuer's
``/.well-known/openid-configuration``. The JWKS bounds (``ATELIER_JWKS_*``) apply to all.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from services.kit.settings import EnvReader

# Asymmetric only: an HMAC algorithm would let anyone holding the public key sign, and
# `none` needs no key at all. Each names one key type, so a key cannot serve two.
ALLOWED_ALGORITHMS = ("RS256", "ES256", "EdDSA")
_NAMESPACE_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
)
_MAX_NAMESPACE = 32


@dataclass(frozen=True)
class TrustedIssuer:
    issuer: str
    audiences: tuple[str, ...]
    algorithms: tuple[str, ...]
    # None: discovered from the issuer's /.well-known/openid-configuration.
    jwks_url: str | None = None
    # "" keeps the issuer's `sub` as the user id; otherwise the id is "<namespace>:<sub>".
    namespace: str = ""

    def user_id(self, subject: str) -> str:
        return f"{self.namespace}:{subject}" if self.namespace else subject

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


@dataclass(frozen=True)
class JwksBounds:
    """How the issuers' key sets are fetched and kept (ATELIER_JWKS_*)."""

    # The response's Cache-Control max-age, clamped to [min, max]; without one, default.
    min_ttl_seconds: float = 60.0
    max_ttl_seconds: float = 24 * 3600.0
    default_ttl_seconds: float = 600.0
    # A token naming a key we do not hold refreshes the set at most once per interval,
    # per issuer, for the whole process; other such tokens are refused meanwhile.
    unknown_kid_interval_seconds: float = 30.0
    # While the JWKS endpoint fails, the last keys fetched keep verifying tokens for this
    # long after they were fetched; past it the issuer's tokens are UNAVAILABLE.
    max_stale_seconds: float = 24 * 3600.0
    # The deadline of one fetch (discovery or key set), connect to last byte.
    fetch_timeout_seconds: float = 3.0

    def ttl(self, max_age: float | None) -> float:
        wanted = self.default_ttl_seconds if max_age is None else max_age
        return min(max(wanted, self.min_ttl_seconds), self.max_ttl_seconds)

    @classmethod
    def read(cls, reader: EnvReader) -> JwksBounds:
        bounds = cls(
            min_ttl_seconds=reader.seconds("JWKS_MIN_TTL", 60.0, minimum=0.1, maximum=86400),
            max_ttl_seconds=reader.seconds(
                "JWKS_MAX_TTL", 24 * 3600.0, minimum=0.1, maximum=7 * 86400
            ),
            default_ttl_seconds=reader.seconds(
                "JWKS_DEFAULT_TTL", 600.0, minimum=0.1, maximum=7 * 86400
            ),
            unknown_kid_interval_seconds=reader.seconds(
                "JWKS_UNKNOWN_KID_INTERVAL", 30.0, minimum=0.1, maximum=3600
            ),
            max_stale_seconds=reader.seconds(
                "JWKS_MAX_STALE", 24 * 3600.0, minimum=0.1, maximum=30 * 86400
            ),
            fetch_timeout_seconds=reader.seconds(
                "JWKS_FETCH_TIMEOUT", 3.0, minimum=0.1, maximum=60
            ),
        )
        reader.require(
            bounds.min_ttl_seconds <= bounds.max_ttl_seconds,
            "JWKS_MIN_TTL",
            "must not exceed ATELIER_JWKS_MAX_TTL",
        )
        return bounds


def read_issuers(reader: EnvReader, self_minted_issuer: str) -> tuple[TrustedIssuer, ...]:
    """ATELIER_JWT_ISSUERS, every problem reported by the reader (the value may be long:
    it is never echoed whole)."""
    raw = reader.string("JWT_ISSUERS", "")
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        reader.require(False, "JWT_ISSUERS", "must be a JSON list of issuer objects")
        return ()
    if not isinstance(value, list) or not value:
        reader.require(False, "JWT_ISSUERS", "must be a non-empty JSON list of issuer objects")
        return ()
    issuers: list[TrustedIssuer] = []
    for index, item in enumerate(value):
        problems: list[str] = []
        issuer = _issuer(item, problems)
        for problem in problems:
            reader.require(False, "JWT_ISSUERS", f"[{index}] {problem}")
        if issuer is not None and not problems:
            issuers.append(issuer)
    names = [i.issuer for i in issuers]
    reader.require(
        len(set(names)) == len(names), "JWT_ISSUERS", "must name each issuer at most once"
    )
    reader.require(
        self_minted_issuer not in names,
        "JWT_ISSUERS",
        "must not name ATELIER_JWT_ISSUER, the issuer of HS256 tokens signed with "
        "ATELIER_JWT_SECRET",
    )
    return tuple(issuers)


_KNOWN_FIELDS = frozenset({"issuer", "audience", "algorithms", "jwks_url", "namespace"})


def _issuer(item: Any, problems: list[str]) -> TrustedIssuer | None:
    if not isinstance(item, dict):
        problems.append("must be an object")
        return None
    unknown = sorted(set(item) - _KNOWN_FIELDS)
    if unknown:
        problems.append(f"has unknown fields {', '.join(map(str, unknown))[:200]}")
    issuer = item.get("issuer")
    if not isinstance(issuer, str) or not _fetchable(issuer):
        problems.append("issuer must be an https:// URL (http:// only on a loopback host)")
    audience = item.get("audience")
    audiences = (audience,) if isinstance(audience, str) else audience
    if (
        not isinstance(audiences, list | tuple)
        or not audiences
        or not all(isinstance(a, str) and a for a in audiences)
    ):
        problems.append("audience must be a non-empty string or list of strings")
    algorithms = item.get("algorithms", ["RS256"])
    if (
        not isinstance(algorithms, list)
        or not algorithms
        or not all(a in ALLOWED_ALGORITHMS for a in algorithms)
    ):
        problems.append(
            f"algorithms must be a non-empty list among {', '.join(ALLOWED_ALGORITHMS)}"
        )
    jwks_url = item.get("jwks_url")
    if jwks_url is not None and (not isinstance(jwks_url, str) or not _fetchable(jwks_url)):
        problems.append("jwks_url must be an https:// URL (http:// only on a loopback host)")
    namespace = item.get("namespace", "")
    if not isinstance(namespace, str) or not (
        len(namespace) <= _MAX_NAMESPACE and set(namespace) <= _NAMESPACE_CHARACTERS
    ):
        problems.append(f"namespace must be at most {_MAX_NAMESPACE} letters, digits and . _ -")
    if problems or not isinstance(audiences, list | tuple):
        return None
    return TrustedIssuer(
        issuer=str(issuer),
        audiences=tuple(str(a) for a in audiences),
        algorithms=tuple(str(a) for a in algorithms),
        jwks_url=None if jwks_url is None else str(jwks_url),
        namespace=str(namespace),
    )


def _fetchable(url: str) -> bool:
    """https://, or http:// to this machine (tests, a sidecar): keys fetched in the clear
    from elsewhere could be anyone's."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    if parts.scheme == "https":
        return True
    if parts.scheme != "http":
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False

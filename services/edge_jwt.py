"""The edge checks the tokens of the trusted issuers itself (Envoy's jwt_authn), so that a
forged one never reaches a service: ``atelier edge-config`` adds the filter from the same
``ATELIER_JWT_ISSUERS`` the services read (services/kit/issuers.py).

What the edge decides, and what it leaves to the services:

- A token whose ``iss`` is a trusted issuer must verify against that issuer's key set,
  name one of its audiences and be in date (with the services' clock skew); otherwise the
  edge answers 401 (UNAUTHENTICATED, ``TOKEN_INVALID`` or ``TOKEN_EXPIRED``) and the call
  goes no further.
- A request without a token, or with one from an issuer the edge does not check (the
  HS256 tokens atelier mints, an issuer whose key set address could not be found), passes:
  the services authenticate every call themselves, and still verify every token the edge
  let through (the header is forwarded as it came).
- A request with ``atelier-on-behalf-of`` whose bearer is no JWT (a service identity's
  credential, acting for a user) passes: the services check that credential.
- Envoy fetches each key set at start and again every ``ATELIER_JWKS_DEFAULT_TTL``; it
  does not refetch on an unknown ``kid`` (an issuer publishes a new key before signing
  with it, so a rotation needs no more than that).

An issuer given without ``jwks_url`` is looked up once, when the config is rendered
(its ``/.well-known/openid-configuration``, within ``ATELIER_JWKS_FETCH_TIMEOUT``); if that
fails the edge does not check that issuer's tokens, says so, and the services still do.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from google.rpc import error_details_pb2, status_pb2

from services.edge_static import TRANSCODER, api_managers
from services.kit.auth import CLOCK_SKEW_SECONDS
from services.kit.delegation import ON_BEHALF_OF_HEADER
from services.kit.issuers import JwksBounds, TrustedIssuer

JWT_AUTHN = "envoy.filters.http.jwt_authn"
# The jwt_authn filter goes right before this one: after the rate limit and the header
# bound (a flood of forged tokens is throttled first), before anything routes or parses.
BEFORE = "atelier.routes"
DOMAIN = "atelier.dev"
# The system's CA bundle in the image (Debian's ca-certificates) for https key sets.
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"
UNAUTHENTICATED = 16
_TYPES = "type.googleapis.com/"
FAILURE_KEY = "jwt_failure"
REFUSAL = "atelier.jwt_refusal"
# jwt_authn's failure codes (Envoy's jwt_verify_lib Status) that pass to the services: no
# token (1, JwtMissed) and a token of an issuer the edge does not check (24,
# JwtUnknownIssuer). Every other failure is refused here.
PASSING_FAILURES = (1, 24)
EXPIRED = 3


@dataclass(frozen=True)
class EdgeIssuer:
    """One issuer the edge checks: where its key set is."""

    issuer: TrustedIssuer
    jwks_url: str


Discover = Callable[[TrustedIssuer, float], str]


def discover(issuer: TrustedIssuer, timeout: float) -> str:
    """The issuer's jwks_uri from its OpenID configuration."""
    # https, or http to a loopback host: read_issuers refuses any other issuer URL.
    request = urllib.request.Request(  # noqa: S310
        issuer.discovery_url, headers={"accept": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        document = json.load(response)
    uri = document.get("jwks_uri") if isinstance(document, dict) else None
    if not isinstance(uri, str) or urlsplit(uri).scheme not in ("https", "http"):
        raise ValueError("the OpenID configuration names no jwks_uri")
    return uri


def edge_issuers(
    issuers: Sequence[TrustedIssuer],
    bounds: JwksBounds,
    warn: Callable[[str], None],
    find: Discover = discover,
) -> list[EdgeIssuer]:
    """The issuers with their key set's address; those whose address cannot be found are
    left out, each with a warning (their tokens pass to the services, which check them)."""
    found = []
    for issuer in issuers:
        url = issuer.jwks_url
        if url is None:
            try:
                url = find(issuer, bounds.fetch_timeout_seconds)
            except (OSError, ValueError) as error:
                warn(
                    f"the edge does not check tokens of {issuer.issuer}: its OpenID "
                    f"configuration could not be read ({type(error).__name__}); the services "
                    "still check them"
                )
                continue
        found.append(EdgeIssuer(issuer, url))
    return found


def add_jwt_authn(
    config: dict[str, Any], issuers: Sequence[EdgeIssuer], bounds: JwksBounds
) -> None:
    """Puts the jwt_authn filter for ``issuers`` in every API manager of ``config``, a
    cluster for each key set, and the JSON and gRPC answers of its refusals. No issuers:
    no filter."""
    if not issuers:
        return
    providers: dict[str, Any] = {}
    clusters = []
    for index, edge_issuer in enumerate(issuers):
        name = f"issuer_{index}"
        cluster = f"jwks_{index}"
        providers[name] = _provider(edge_issuer, cluster, bounds)
        clusters.append(_jwks_cluster(cluster, edge_issuer.jwks_url, bounds))
    jwt_filter = {
        "name": JWT_AUTHN,
        "typed_config": {
            "@type": _TYPES + "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": providers,
            "rules": [
                # A service identity acting for a user (services/kit/delegation.py) sends
                # its own credential, which is no JWT (no dots): left to the services,
                # which check it against the identities' hashes. Any JWT-shaped token
                # with the header falls to the next rule and is checked as usual.
                {
                    "match": {
                        "prefix": "/",
                        "headers": [
                            {"name": ON_BEHALF_OF_HEADER, "present_match": True},
                            {
                                "name": "authorization",
                                "string_match": {"safe_regex": {"regex": "Bearer [^.]+"}},
                            },
                        ],
                    }
                },
                {
                    "match": {"prefix": "/"},
                    # One of the trusted issuers, or no token of theirs at all.
                    "requires": {
                        "requires_any": {
                            "requirements": [{"provider_name": p} for p in providers]
                            + [{"allow_missing_or_failed": {}}]
                        }
                    },
                },
            ],
        },
    }
    managers = 0
    for manager in api_managers(config):
        filters = manager["http_filters"]
        position = next(i for i, f in enumerate(filters) if f["name"] == BEFORE)
        filters[position:position] = [jwt_filter, _refusal_filter()]
        mappers = manager["local_reply_config"]["mappers"]
        mappers[1:1] = _refusal_mappers()
        managers += 1
    if managers == 0:
        raise ValueError(f"the config has no manager with {TRANSCODER}")
    config["static_resources"]["clusters"].extend(clusters)


def _refusal_filter() -> dict[str, Any]:
    """Refuses a request whose token jwt_authn could not verify, unless it had none or
    its issuer is not one the edge checks (jwt_authn lets every request through and
    records why a token failed: it cannot tell "not ours" from "forged" by itself)."""

    def failure_code(match: dict[str, Any]) -> dict[str, Any]:
        return {
            "sourced_metadata": {
                "metadata_matcher": {
                    "filter": JWT_AUTHN,
                    "path": [{"key": FAILURE_KEY}, {"key": "code"}],
                    "value": match,
                }
            }
        }

    return {
        "name": REFUSAL,
        "typed_config": {
            "@type": _TYPES + "envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": {
                "action": "DENY",
                "policies": {
                    "token_refused": {
                        "permissions": [{"any": True}],
                        "principals": [
                            {
                                "and_ids": {
                                    "ids": [failure_code({"present_match": True})]
                                    + [
                                        {"not_id": failure_code({"double_match": {"exact": code}})}
                                        for code in PASSING_FAILURES
                                    ]
                                }
                            }
                        ],
                    }
                },
            },
        },
    }


def _provider(edge_issuer: EdgeIssuer, cluster: str, bounds: JwksBounds) -> dict[str, Any]:
    issuer = edge_issuer.issuer
    return {
        "issuer": issuer.issuer,
        "audiences": list(issuer.audiences),
        "remote_jwks": {
            "http_uri": {
                "uri": edge_issuer.jwks_url,
                "cluster": cluster,
                "timeout": _seconds(bounds.fetch_timeout_seconds),
            },
            "cache_duration": _seconds(bounds.default_ttl_seconds),
            # Fetched when Envoy starts (the listener waits for the first attempt, so the
            # first calls find the keys); a failed fetch is retried every 5 s, and a token
            # of this issuer is refused while no key set is held.
            "async_fetch": {"failed_refetch_duration": "5s"},
            "retry_policy": {
                "num_retries": 2,
                "retry_back_off": {"base_interval": "0.5s", "max_interval": "5s"},
            },
        },
        "from_headers": [{"name": "authorization", "value_prefix": "Bearer "}],
        # The services verify it again: the header goes on as it came.
        "forward": True,
        "clock_skew_seconds": CLOCK_SKEW_SECONDS,
        "failed_status_in_metadata": FAILURE_KEY,
    }


def _jwks_cluster(name: str, url: str, bounds: JwksBounds) -> dict[str, Any]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": _seconds(bounds.fetch_timeout_seconds),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }
    if tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": _TYPES + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": host,
                "common_tls_context": {
                    "validation_context": {
                        "trusted_ca": {"filename": SYSTEM_CAS},
                        "match_typed_subject_alt_names": [
                            {"san_type": "DNS", "matcher": {"exact": host}}
                        ],
                    }
                },
            },
        }
    return cluster


def _refusal_mappers() -> list[dict[str, Any]]:
    """The refusal filter's 403s as our services' answers to a bad token: 401 with a JSON
    google.rpc.Status for JSON calls, UNAUTHENTICATED with that Status in
    grpc-status-details-bin for native gRPC."""
    mappers = []
    for reason, message, expired in (
        ("TOKEN_EXPIRED", "the token has expired", True),
        ("TOKEN_INVALID", "the token does not verify for its issuer", False),
    ):
        code = f"metadata.filter_metadata['{JWT_AUTHN}']['{FAILURE_KEY}']['code']"
        refused = (
            "response.code == 403 && response.code_details.startsWith('rbac_access_denied') && "
            f"{code} {'==' if expired else '!='} {EXPIRED}"
        )
        grpc_call = (
            "'content-type' in request.headers && "
            "request.headers['content-type'].startsWith('application/grpc') && "
            "!('x-envoy-original-path' in request.headers)"
        )
        mappers.append(
            {
                "filter": _cel(f"{refused} && {grpc_call}"),
                "status_code": 401,
                "headers_to_add": [
                    _header("grpc-status", str(UNAUTHENTICATED)),
                    _header("grpc-message", message),
                    _header("grpc-status-details-bin", _status_bin(reason, message)),
                ],
            }
        )
        mappers.append(
            {
                "filter": _cel(f"{refused} && !({grpc_call})"),
                "status_code": 401,
                "headers_to_add": [_header("www-authenticate", 'Bearer error="invalid_token"')],
                "body_format_override": {
                    "content_type": "application/json",
                    "json_format": {
                        "code": UNAUTHENTICATED,
                        "message": message,
                        "details": [
                            {
                                "@type": _TYPES + "google.rpc.ErrorInfo",
                                "reason": reason,
                                "domain": DOMAIN,
                            }
                        ],
                    },
                },
            }
        )
    return mappers


def _status_bin(reason: str, message: str) -> str:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN)
    status = status_pb2.Status(code=UNAUTHENTICATED, message=message)
    status.details.add().Pack(info)
    # grpc-status-details-bin is unpadded base64 on the wire; gRPC libraries accept both.
    return base64.b64encode(status.SerializeToString()).decode()


def _cel(expression: str) -> dict[str, Any]:
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": _TYPES + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                "expression": expression,
            },
        }
    }


def _header(key: str, value: str) -> dict[str, Any]:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def _seconds(value: float) -> str:
    return f"{value:g}s"

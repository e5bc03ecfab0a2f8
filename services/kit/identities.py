"""Who may call the internal listeners (``ATELIER_SERVICE_IDENTITIES``), and what.

Each calling identity (creation, notify, an operator, an app backend) holds its own
credential; the setting knows each only by the SHA-256 of its credentials (one or two:
two are valid at once while a credential is rotated), so it holds no secret. The value
is a JSON list, one object per identity::

    [{"name": "creation", "role": "creation", "credential_sha256": ["<hex>"]},
     {"name": "alice", "role": "operator", "credential_sha256": ["<hex>", "<hex>"]},
     {"name": "shop", "role": "backend", "credential_sha256": ["<hex>"],
      "act_for_users": true, "allow": ["/atelier.media.v1.MediaInternalService/ImportAsset"]},
     {"name": "billing", "role": "backend", "credential_sha256": ["<hex>"],
      "allow": ["/atelier.notify.v1.NotifyFeedService/WatchAllJobs"]}]

A role grants its internal RPCs (:data:`ROLE_METHODS`); ``allow`` adds full method
names or whole services (``/package.Service/*``). Whatever no grant names is
PERMISSION_DENIED (``RPC_NOT_PERMITTED``). ``act_for_users`` lets the identity call the
public RPCs for a user it names (services/kit/delegation.py); ``per_job_webhooks`` lets
it, so acting, give SubmitJob a webhook of the job's own (docs/webhooks.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.kit.settings import EnvReader

SETTING = "SERVICE_IDENTITIES"

_MEDIA = "/atelier.media.v1.MediaInternalService/"
_ADMIN = "/atelier.creation.v1.AdminService/"
_NOTIFY_ADMIN = "/atelier.notify.v1.NotifyAdminService/"
# The feed of every user's job changes (docs/feed.md). No role has it by default: it shows
# every user's jobs, so each identity that reads it is named for it (``allow``).
WATCH_ALL_JOBS = "/atelier.notify.v1.NotifyFeedService/WatchAllJobs"

# What each role may call, by default. creation stores and signs every job's media and
# feeds notify; notify signs output URLs and reads queue standings; operators run
# AdminService and notify's NotifyAdminService (the failed pushes); an app backend calls
# nothing internal unless `allow` says so (the job feed, WATCH_ALL_JOBS, included: not
# even creation or an operator reads it by default).
ROLE_METHODS: dict[str, tuple[str, ...]] = {
    "creation": (_MEDIA + "*", "/atelier.notify.v1.NotifyIngestService/Deliver"),
    "notify": (
        _MEDIA + "GetAssetUrls",
        "/atelier.creation.v1.QueueStandingService/GetQueueStandings",
    ),
    "operator": (_ADMIN + "*", _NOTIFY_ADMIN + "*"),
    "backend": (),
}

MAX_CREDENTIALS = 2  # the current one and, while rotating, the next (or the previous)
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# /package.Service/Method or /package.Service/* (a leading slash may be left out).
_WORD = r"[A-Za-z_][A-Za-z0-9_]*"
_METHOD = re.compile(rf"/?({_WORD}\.)+{_WORD}/(\*|{_WORD})")
_KNOWN_FIELDS = frozenset(
    {"name", "role", "credential_sha256", "allow", "act_for_users", "per_job_webhooks"}
)


@dataclass(frozen=True)
class ServiceIdentity:
    name: str
    role: str
    # Lowercase hex SHA-256 of each valid credential.
    credential_hashes: tuple[str, ...]
    # Full method names ("/pkg.Service/Method") and service prefixes ("/pkg.Service/").
    methods: frozenset[str]
    services: frozenset[str]
    act_for_users: bool = False
    # May give SubmitJob a per-job webhook (signed with its own key).
    per_job_webhooks: bool = False

    def may_call(self, method: str) -> bool:
        if method in self.methods:
            return True
        service, _, _ = method.rpartition("/")
        return service + "/" in self.services

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def holder(identities: tuple[ServiceIdentity, ...], credential: str) -> ServiceIdentity | None:
    """The identity holding ``credential``, None when none does. Every hash is compared,
    in constant time, whichever matches: how long it takes says nothing of which."""
    digest = hashlib.sha256(credential.encode()).hexdigest().encode()
    found = None
    for identity in identities:
        for known in identity.credential_hashes:
            if hmac.compare_digest(digest, known.encode()):
                found = identity
    return found


def grants(role: str, patterns: tuple[str, ...]) -> tuple[frozenset[str], ...]:
    """(methods, services) that ``role`` plus ``patterns`` allow."""
    methods: set[str] = set()
    services: set[str] = set()
    for pattern in (*ROLE_METHODS.get(role, ()), *patterns):
        full = pattern if pattern.startswith("/") else "/" + pattern
        if full.endswith("/*"):
            services.add(full[:-1])
        else:
            methods.add(full)
    return frozenset(methods), frozenset(services)


def read_identities(reader: EnvReader) -> tuple[ServiceIdentity, ...]:
    """ATELIER_SERVICE_IDENTITIES, every problem reported by the reader; the value is never
    echoed (it holds only hashes, but a pasted credential must not reach a log)."""
    raw = reader.string(SETTING, "")
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        reader.require(False, SETTING, "must be a JSON list of identity objects")
        return ()
    if not isinstance(value, list) or not value:
        reader.require(False, SETTING, "must be a non-empty JSON list of identity objects")
        return ()
    identities: list[ServiceIdentity] = []
    for index, item in enumerate(value):
        problems: list[str] = []
        identity = _identity(item, problems)
        for problem in problems:
            reader.require(False, SETTING, f"[{index}] {problem}")
        if identity is not None and not problems:
            identities.append(identity)
    names = [i.name for i in identities]
    reader.require(len(set(names)) == len(names), SETTING, "must name each identity once")
    hashes = [h for i in identities for h in i.credential_hashes]
    reader.require(
        len(set(hashes)) == len(hashes),
        SETTING,
        "must list each credential hash once (two identities cannot share a credential)",
    )
    return tuple(identities)


def _identity(item: Any, problems: list[str]) -> ServiceIdentity | None:
    if not isinstance(item, dict):
        problems.append("must be an object")
        return None
    unknown = sorted(set(item) - _KNOWN_FIELDS)
    if unknown:
        problems.append(f"has unknown fields {', '.join(map(str, unknown))[:200]}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append("name must be 1-63 characters of a-z, 0-9 and . _ - (starting a-z, 0-9)")
    role = item.get("role", "")
    if not isinstance(role, str) or (role and role not in ROLE_METHODS):
        problems.append(f"role must be one of {', '.join(ROLE_METHODS)} (or left out)")
    hashes = item.get("credential_sha256")
    if isinstance(hashes, str):
        hashes = [hashes]
    if (
        not isinstance(hashes, list)
        or not 1 <= len(hashes) <= MAX_CREDENTIALS
        or not all(isinstance(h, str) and _SHA256_HEX.fullmatch(h.lower()) for h in hashes)
    ):
        # Never the value: someone may have pasted the credential itself.
        problems.append(
            f"credential_sha256 must be 1 to {MAX_CREDENTIALS} SHA-256 hashes in hex "
            "(64 characters each; the hash of the credential, never the credential)"
        )
        hashes = []
    allow = item.get("allow", [])
    if not isinstance(allow, list) or not all(
        isinstance(p, str) and _METHOD.fullmatch(p) for p in allow
    ):
        problems.append(
            "allow must be a list of full method names (/package.Service/Method) or "
            "services (/package.Service/*)"
        )
        allow = []
    act_for_users = item.get("act_for_users", False)
    if not isinstance(act_for_users, bool):
        problems.append("act_for_users must be true or false")
    per_job_webhooks = item.get("per_job_webhooks", False)
    if not isinstance(per_job_webhooks, bool):
        problems.append("per_job_webhooks must be true or false")
    if problems:
        return None
    methods, services = grants(str(role), tuple(str(p) for p in allow))
    return ServiceIdentity(
        name=str(name),
        role=str(role),
        credential_hashes=tuple(str(h).lower() for h in hashes),
        methods=methods,
        services=services,
        act_for_users=bool(act_for_users),
        per_job_webhooks=bool(per_job_webhooks),
    )


def entry(
    name: str,
    role: str,
    credentials: tuple[str, ...],
    *,
    allow: tuple[str, ...] = (),
    act_for_users: bool = False,
    per_job_webhooks: bool = False,
) -> dict[str, Any]:
    """One identity of ATELIER_SERVICE_IDENTITIES for these raw credentials (the dev stack
    and tests make theirs with it; a deployment writes the hashes itself)."""
    described: dict[str, Any] = {
        "name": name,
        "credential_sha256": [hashlib.sha256(c.encode()).hexdigest() for c in credentials],
    }
    if role:
        described["role"] = role
    if allow:
        described["allow"] = list(allow)
    if act_for_users:
        described["act_for_users"] = True
    if per_job_webhooks:
        described["per_job_webhooks"] = True
    return described

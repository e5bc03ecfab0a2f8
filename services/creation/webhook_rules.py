"""What a webhook endpoint may be (AdminService's endpoints and SubmitJob's per-job
webhook alike), checked field by field; every problem is a field violation."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from atelier.creation.v1 import creation_service_pb2
from services.creation.errors import Reason, WebhookNotPermitted
from services.creation.submission import JobWebhook, has_control_characters, is_catalog_id
from services.creation.tables import WEBHOOK_EVENT_TYPES
from services.kit.addresses import AddressPolicy
from services.kit.auth import Principal, principal_id_problem
from services.kit.errors import FieldViolation, invalid_argument

MAX_URL = 2048
MAX_DESCRIPTION = 500
MAX_FILTER_IDS = 100
DEFAULT_MAX_IN_FLIGHT = 8
MAX_IN_FLIGHT = 1000
# A per-job webhook that names no events gets every one but job.progress.
DEFAULT_JOB_EVENTS = tuple(t for t in WEBHOOK_EVENT_TYPES if t != "job.progress")
# RotateWebhookSecret's overlap: unset means a day, at most a week.
DEFAULT_OVERLAP_SECONDS = 86400.0
MAX_OVERLAP_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class UrlRule:
    """Whether plain http is allowed (ATELIER_WEBHOOK_ALLOW_HTTP: dev and test only), and
    the addresses the deliverer may reach (ATELIER_WEBHOOK_ALLOWED_NETWORKS beside the
    public ones): a URL naming an address literally is refused at once when the deliverer
    would refuse it (a name is resolved, and checked, at each delivery)."""

    allow_http: bool = False
    addresses: AddressPolicy = dataclasses.field(default_factory=AddressPolicy)


def check_url(field: str, url: str, rule: UrlRule, problems: list[FieldViolation]) -> str:
    if not url:
        problems.append(FieldViolation(field, "is required"))
        return url
    if len(url) > MAX_URL:
        problems.append(FieldViolation(field, f"must be at most {MAX_URL} characters"))
        return url
    if has_control_characters(url) or any(c.isspace() for c in url):
        problems.append(FieldViolation(field, "must not contain spaces or control characters"))
        return url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError:
        problems.append(FieldViolation(field, "is not a URL"))
        return url
    schemes = ("https", "http") if rule.allow_http else ("https",)
    if parts.scheme not in schemes:
        problems.append(
            FieldViolation(
                field,
                "must be an https URL" if not rule.allow_http else "must be an https or http URL",
            )
        )
    elif not parts.hostname:
        problems.append(FieldViolation(field, "must name a host"))
    elif parts.username is not None or parts.password is not None:
        problems.append(FieldViolation(field, "must not carry a user or password"))
    elif parts.fragment:
        problems.append(FieldViolation(field, "must not carry a fragment"))
    else:
        why = _literal_refused(parts.hostname, rule.addresses)
        if why is not None:
            problems.append(
                FieldViolation(field, f"names an address webhooks may not reach: {why}")
            )
    return url


def _literal_refused(host: str, addresses: AddressPolicy) -> str | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name
    why = addresses.why_refused(address)
    return None if why is None else f"{address} is {why}"


def check_event_types(
    field: str,
    names: Sequence[str],
    problems: list[FieldViolation],
    *,
    default: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """The event types, each once; empty is ``default`` (None: refused)."""
    if not names:
        if default is None:
            problems.append(FieldViolation(field, "must name at least one event type"))
        return default or ()
    known = set(WEBHOOK_EVENT_TYPES)
    for name in names:
        if name not in known:
            # The value is short and ours to print only when it is printable.
            shown = name[:40] if not has_control_characters(name) else "?"
            problems.append(
                FieldViolation(field, f"{shown!r} is not one of {', '.join(WEBHOOK_EVENT_TYPES)}")
            )
    if len(set(names)) != len(names):
        problems.append(FieldViolation(field, "must name each event type once"))
    return tuple(names)


def check_user_ids(
    field: str, values: Sequence[str], problems: list[FieldViolation]
) -> tuple[str, ...]:
    if len(values) > MAX_FILTER_IDS:
        problems.append(FieldViolation(field, f"must be at most {MAX_FILTER_IDS} ids"))
        return tuple(values)
    for value in values:
        problem = principal_id_problem(value)
        if problem is not None:
            problems.append(FieldViolation(field, problem))
            break
    return tuple(values)


def check_model_ids(
    field: str, values: Sequence[str], problems: list[FieldViolation]
) -> tuple[str, ...]:
    if len(values) > MAX_FILTER_IDS:
        problems.append(FieldViolation(field, f"must be at most {MAX_FILTER_IDS} ids"))
    elif not all(is_catalog_id(v) for v in values):
        problems.append(FieldViolation(field, "must be catalog model ids"))
    return tuple(values)


def check_description(field: str, value: str, problems: list[FieldViolation]) -> str:
    if len(value) > MAX_DESCRIPTION:
        problems.append(FieldViolation(field, f"must be at most {MAX_DESCRIPTION} characters"))
    elif has_control_characters(value):
        problems.append(FieldViolation(field, "must not contain control characters"))
    return value


def check_max_in_flight(
    field: str, value: int, problems: list[FieldViolation], *, zero_is_default: bool
) -> int:
    if value == 0 and zero_is_default:
        return DEFAULT_MAX_IN_FLIGHT
    if not 1 <= value <= MAX_IN_FLIGHT:
        problems.append(FieldViolation(field, f"must be 1 to {MAX_IN_FLIGHT}"))
    return value


@dataclass(frozen=True)
class JobWebhookRule:
    """Who may give SubmitJob a per-job webhook: a service identity with per_job_webhooks
    acting for the user (never an end user: a user-given URL is an SSRF door)."""

    identities: frozenset[str] = frozenset()
    url: UrlRule = UrlRule()

    def check(self, given: creation_service_pb2.JobWebhook, caller: Principal) -> JobWebhook:
        """The webhook, or PERMISSION_DENIED WEBHOOK_NOT_PERMITTED (before anything of it
        is looked at), or INVALID_ARGUMENT INVALID_JOB_REQUEST with its violations."""
        if not caller.identity or caller.identity not in self.identities:
            raise WebhookNotPermitted()
        problems: list[FieldViolation] = []
        url = check_url("webhook.url", given.url, self.url, problems)
        events = check_event_types(
            "webhook.event_types", given.event_types, problems, default=DEFAULT_JOB_EVENTS
        )
        if problems:
            raise invalid_argument(Reason.INVALID_JOB_REQUEST, problems)
        return JobWebhook(url, events)

"""The HTTP side every hosted adapter shares: one client per vendor (HTTP/2 where the
vendor offers it), and the mapping of what a call can end in onto the failure table.

The one distinction that matters most is on submit: a request that never left (refused
connection, connect timeout, no pooled connection) is safe to send again, while one that
was sent and got no answer (read timeout, reset, a gateway timeout) may have started a
paid generation: that is ``outcome_unknown`` and the job waits for an operator.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum

import httpx

from services.creation.providers.base import ProviderError

# httpx logs every request at INFO (a line per poll of every job, with output URLs that
# may be signed); our own log lines say what matters.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)

# Sent on every vendor call: which worker process made it. Vendors ignore it; the fake
# vendors of the tests count requests in flight per process by it.
PROCESS_HEADER = "X-Atelier-Process"
PROCESS_ID = uuid.uuid4().hex[:16]
USER_AGENT = "atelier-worker"
# The longest Retry-After we keep (a larger one is the failure table's cap anyway).
MAX_RETRY_AFTER_SECONDS = 3600.0
# How much of a vendor's error text an error message carries.
DETAIL_CHARS = 300


class Call(Enum):
    SUBMIT = "submit"
    POLL = "poll"
    CANCEL = "cancel"
    RESULT = "result"


def vendor_client(
    base_url: str,
    auth_header: str,
    *,
    connect_timeout: float,
    request_timeout: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """A client for one vendor's API; ``auth_header`` is the Authorization value, kept
    only in the client's headers (httpx never prints them)."""
    return httpx.AsyncClient(
        base_url=base_url,
        http2=transport is None,
        transport=transport,
        timeout=httpx.Timeout(request_timeout, connect=connect_timeout, pool=connect_timeout),
        headers={
            "Authorization": auth_header,
            "User-Agent": USER_AGENT,
            PROCESS_HEADER: PROCESS_ID,
        },
        follow_redirects=False,
    )


def transport_error(error: httpx.TransportError, call: Call) -> ProviderError:
    """A call that got no HTTP answer. Only a submit can leave an unknown outcome, and only
    once its request may have been sent."""
    never_sent = isinstance(
        error,
        httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol,
    )
    timed_out = isinstance(error, httpx.TimeoutException)
    code = "TIMEOUT" if timed_out else "UNAVAILABLE"
    stage = "before sending" if never_sent else "after sending"
    return ProviderError(
        code,
        f"{call.value}: {type(error).__name__} {stage}",
        retryable=True,
        outcome_unknown=call is Call.SUBMIT and not never_sent,
    )


def retry_after(headers: Mapping[str, str], body_text: str = "") -> float | None:
    """The delay a 429 or 503 asks for: the Retry-After header (seconds or an HTTP date),
    else a "N second(s)" / "~Ns" in the body (Replicate words its throttle that way)."""
    value = headers.get("retry-after")
    if value:
        value = value.strip()
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            seconds = (when - datetime.now(UTC)).total_seconds() if when and when.tzinfo else -1.0
        if seconds >= 0:
            return min(seconds, MAX_RETRY_AFTER_SECONDS)
    found = re.search(r"(\d+(?:\.\d+)?)\s*(?:s\b|sec|second)", body_text)
    if found:
        return min(float(found.group(1)), MAX_RETRY_AFTER_SECONDS)
    return None


def status_error(response: httpx.Response, call: Call, detail: str) -> ProviderError:
    """A status answer that is a call failure rather than the generation's own verdict:
    429, 5xx, 408, and the credential answers. ``detail`` is the vendor's text, already
    shortened. Callers map their 4xx error bodies themselves before calling this."""
    status = response.status_code
    if status == 429:
        return ProviderError(
            "RATE_LIMITED",
            f"{call.value}: HTTP 429 {detail}".rstrip(),
            retryable=True,
            retry_after_seconds=retry_after(response.headers, detail),
        )
    if status in (401, 402, 403):
        return ProviderError(
            "AUTH_REJECTED", f"{call.value}: HTTP {status} {detail}".rstrip(), retryable=False
        )
    if status in (408, 504):
        # A gateway gave up waiting for the vendor: a submit may have been accepted.
        return ProviderError(
            "TIMEOUT",
            f"{call.value}: HTTP {status}",
            retryable=True,
            outcome_unknown=call is Call.SUBMIT and status == 504,
        )
    if status >= 500:
        # The vendor answered, and a 500/502/503 on create means it did not create.
        return ProviderError(
            "UNAVAILABLE",
            f"{call.value}: HTTP {status}",
            retryable=True,
            retry_after_seconds=retry_after(response.headers) if status == 503 else None,
        )
    return ProviderError(
        "INVALID_INPUT", f"{call.value}: HTTP {status} {detail}".rstrip(), retryable=False
    )


def short(text: object) -> str:
    """A vendor's message, on one line and short enough for a job's error field."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= DETAIL_CHARS else flat[: DETAIL_CHARS - 1] + "…"


def json_or_none(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


def unexpected_body(call: Call, what: str) -> ProviderError:
    """An answer we cannot read: for a submit the vendor may have created something."""
    return ProviderError(
        "UNAVAILABLE",
        f"{call.value}: the answer {what}",
        retryable=True,
        outcome_unknown=call is Call.SUBMIT,
    )


_PERCENT = re.compile(r"(\d{1,3}(?:\.\d+)?)\s?%")


def progress_from_logs(logs: str) -> int | None:
    """The last percentage a model printed (tqdm-style ``45%|████ | 23/50``), or None."""
    found = _PERCENT.findall(logs)
    if not found:
        return None
    return max(0, min(99, int(float(found[-1]))))

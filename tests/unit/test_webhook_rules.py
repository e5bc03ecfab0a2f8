"""What a webhook endpoint may be (services/creation/webhook_rules.py): URLs (https
unless plain http is allowed), event types, and who may give SubmitJob a webhook."""

from __future__ import annotations

import pytest

from atelier.creation.v1 import creation_service_pb2
from services.creation.errors import WebhookNotPermitted
from services.creation.webhook_rules import (
    DEFAULT_JOB_EVENTS,
    JobWebhookRule,
    UrlRule,
    check_event_types,
    check_url,
)
from services.kit.addresses import AddressPolicy
from services.kit.auth import Principal
from services.kit.errors import ApiError, FieldViolation


def url_problems(url: str, allow_http: bool = False, allowed: tuple[str, ...] = ()) -> list[str]:
    problems: list[FieldViolation] = []
    check_url("url", url, UrlRule(allow_http, AddressPolicy.allowing(allowed)), problems)
    return [p.description for p in problems]


@pytest.mark.parametrize(
    "url",
    ["https://hooks.example.com/x", "https://93.184.215.14:8443/a?b=c", "https://localhost/h"],
)
def test_https_urls_pass(url: str) -> None:
    """A name passes whatever it resolves to now: it is resolved and checked at each
    delivery."""
    assert url_problems(url) == []


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://[::1]/hook", "loopback"),
        ("https://10.0.0.1:8443/a", "private"),
        ("https://[::ffff:169.254.169.254]/x", "IPv6 form of 169.254.169.254"),
        ("https://0.0.0.0/x", "unspecified"),
    ],
)
def test_a_url_naming_an_address_the_deliverer_refuses_is_refused_at_once(
    url: str, words: str
) -> None:
    (problem,) = url_problems(url)
    assert problem.startswith("names an address webhooks may not reach") and words in problem


def test_a_literal_address_in_the_allowed_networks_passes() -> None:
    assert url_problems("https://10.0.0.1:8443/a", allowed=("10.0.0.0/8",)) == []
    assert url_problems("http://127.0.0.1:9000/a", True, ("127.0.0.0/8",)) == []


@pytest.mark.parametrize(
    ("url", "allow_http", "words"),
    [
        ("http://hooks.example.com/x", False, "https"),
        ("ftp://hooks.example.com/x", True, "https or http"),
        ("https://u:p@hooks.example.com/", False, "user"),
        ("https:///x", False, "host"),
        ("https://hooks.example.com/#frag", False, "fragment"),
        ("https://hooks.example.com:99999/", False, "not a URL"),
        ("https://hooks example.com/", False, "spaces"),
        ("https://x.example.com/" + "a" * 2048, False, "2048"),
        ("", False, "required"),
    ],
)
def test_bad_urls_are_named(url: str, allow_http: bool, words: str) -> None:
    [problem] = url_problems(url, allow_http)
    assert words in problem


def test_plain_http_only_where_allowed() -> None:
    assert url_problems("http://hooks.test:8080/hooks", allow_http=True) == []


def test_event_types_default_and_refusals() -> None:
    problems: list[FieldViolation] = []
    assert check_event_types("e", [], problems, default=DEFAULT_JOB_EVENTS) == DEFAULT_JOB_EVENTS
    assert "job.progress" not in DEFAULT_JOB_EVENTS and problems == []
    check_event_types("e", [], problems)
    check_event_types("e", ["job.queued", "job.queued", "job.\x00"], problems)
    assert [p.description for p in problems] == [
        "must name at least one event type",
        "'?' is not one of job.queued, job.running, job.succeeded, job.failed,"
        " job.cancelled, job.needs_attention, job.deleted, job.progress",
        "must name each event type once",
    ]


RULE = JobWebhookRule(frozenset({"shop"}))
HOOK = creation_service_pb2.JobWebhook(url="https://shop.example.com/h")


@pytest.mark.parametrize(
    "caller",
    [
        Principal(user_id="u-1"),
        Principal(user_id="u-1", identity="feed", role="backend"),
        Principal(user_id="", is_service=True),
    ],
)
def test_only_a_permitted_identity_may_give_a_webhook(caller: Principal) -> None:
    with pytest.raises(WebhookNotPermitted):
        RULE.check(HOOK, caller)


def test_a_permitted_identitys_webhook_is_checked() -> None:
    caller = Principal(user_id="u-1", identity="shop", role="backend")
    assert RULE.check(HOOK, caller).event_types == DEFAULT_JOB_EVENTS
    with pytest.raises(ApiError) as refused:
        RULE.check(creation_service_pb2.JobWebhook(url="http://x.example.com/"), caller)
    assert refused.value.reason == "INVALID_JOB_REQUEST"

"""creation's pure rules: request validation and hashing, the transition table, what the
reaper does with an expired lease, backoff."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import timedelta

import pytest

from services.creation import submission
from services.creation.domain import (
    TRANSITIONS,
    LedgerKind,
    ReapDecision,
    Status,
    Step,
    backoff,
    ledger_effect,
    may_change,
    reap_decision,
)

VALID = {
    "idempotency_key": None,
    "model_id": "stub-fast",
    "style_id": "anime",
    "input_asset_id": "0b6f2d4e-8c1a-4f3b-9e7d-5a2c1b0e9f8d",
    "prompt": "a lighthouse at dusk",
    "negative_prompt": "",
    "width": 512,
    "height": 768,
    "parameters": dict(seed=42, guidance_scale=7.5),
}


def check(**changes: object) -> list[str]:
    _, problems = submission.validate(**{**VALID, **changes})  # type: ignore[arg-type]
    return [p.field for p in problems]


def test_a_valid_request_passes() -> None:
    command, problems = submission.validate(**VALID)  # type: ignore[arg-type]
    assert problems == []
    assert command is not None
    assert command.width == 512


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model_id": ""}, "model_id"),
        ({"model_id": "Not A Model"}, "model_id"),
        ({"style_id": "x" * 80}, "style_id"),
        ({"input_asset_id": "not-a-uuid"}, "input_asset_id"),
        ({"input_url": "https://x/" + "a" * 2048}, "input_url"),
        ({"input_url": "https://a b/"}, "input_url"),
        ({"input_asset_id": "../../etc/passwd"}, "input_asset_id"),
        ({"prompt": "x" * 2001}, "prompt"),
        ({"prompt": "nul\x00byte"}, "prompt"),
        ({"negative_prompt": "y" * 1001}, "negative_prompt"),
        ({"width": 0}, "width"),
        ({"height": -8}, "height"),
        ({"parameters": {"guidance_scale": float("inf")}}, "parameters.guidance_scale"),
        ({"parameters": {"strength": float("nan")}}, "parameters.strength"),
        ({"parameters": {"steps": None}}, "parameters.steps"),
        ({"parameters": {"Steps": 3}}, "parameters"),
    ],
)
def test_each_bad_field_is_named(changes: dict[str, object], field: str) -> None:
    assert field in check(**changes)


def test_every_problem_is_reported_at_once() -> None:
    assert set(check(width=0, height=0, model_id="")) == {"width", "height", "model_id"}


def test_the_parameters_hash_as_the_free_form_object_did() -> None:
    """{"seed": 7} hashed the same before parameters were typed: a replay of a request made
    before the upgrade finds its job."""
    command, _ = submission.validate(**{**VALID, "parameters": dict(seed=7)})  # type: ignore[arg-type]
    assert command is not None
    canonical = {
        "model_id": "stub-fast",
        "style_id": "anime",
        "input_asset_id": VALID["input_asset_id"],
        "prompt": "a lighthouse at dusk",
        "negative_prompt": "",
        "width": 512,
        "height": 768,
        "parameters": {"seed": 7},
    }
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert command.request_hash() == hashlib.sha256(encoded.encode()).hexdigest()


def test_multiline_prompts_are_fine() -> None:
    assert check(prompt="line one\nline two\ttabbed") == []


def test_hash_ignores_spelling_but_not_content() -> None:
    a, _ = submission.validate(**{**VALID, "parameters": dict(seed=42, steps=20)})  # type: ignore[arg-type]
    b, _ = submission.validate(
        **{**VALID, "parameters": dict(steps=20, seed=42), "idempotency_key": "k"}
    )  # type: ignore[arg-type]
    c, _ = submission.validate(**{**VALID, "parameters": dict(seed=42, steps=21)})  # type: ignore[arg-type]
    # Seeds that one double cannot tell apart are different requests.
    d, _ = submission.validate(**{**VALID, "parameters": dict(seed=2**63 - 1, steps=20)})  # type: ignore[arg-type]
    e, _ = submission.validate(**{**VALID, "parameters": dict(seed=2**63 - 2, steps=20)})  # type: ignore[arg-type]
    assert a is not None and b is not None and c is not None and d is not None and e is not None
    assert a.request_hash() == b.request_hash()
    assert len({a.request_hash(), c.request_hash(), d.request_hash(), e.request_hash()}) == 4
    # A UUID in upper case is the same asset, so the same request.
    upper_id = str(VALID["input_asset_id"]).upper()
    upper, _ = submission.validate(
        **{**VALID, "input_asset_id": upper_id, "parameters": dict(seed=42, steps=20)}
    )  # type: ignore[arg-type]
    assert upper is not None
    assert upper.request_hash() == a.request_hash()


@pytest.mark.parametrize(
    ("field", "header", "key", "problem"),
    [
        ("", None, None, False),
        ("abc", None, "abc", False),
        ("", "from-header", "from-header", False),
        ("same", "same", "same", False),
        ("one", "two", None, True),
        ("has space", None, None, True),
        ("x" * 129, None, None, True),
    ],
)
def test_idempotency_key_from_field_or_header(
    field: str, header: str | None, key: str | None, problem: bool
) -> None:
    chosen, problems = submission.choose_idempotency_key(field, header)
    assert chosen == key
    assert bool(problems) is problem


def test_terminal_states_have_no_way_out() -> None:
    for source, _ in TRANSITIONS:
        assert not source.terminal
    assert not may_change(Status.SUCCEEDED, Status.QUEUED)
    assert may_change(Status.NEEDS_ATTENTION, Status.QUEUED)


def test_ledger_effects() -> None:
    assert ledger_effect(Status.SUCCEEDED) is LedgerKind.CAPTURE
    assert ledger_effect(Status.FAILED) is LedgerKind.RELEASE
    assert ledger_effect(Status.CANCELLED) is LedgerKind.RELEASE
    assert ledger_effect(Status.NEEDS_ATTENTION) is None


@pytest.mark.parametrize(
    ("step", "has_request", "cancel", "left", "idempotent", "decision"),
    [
        (Step.PREPARING, False, False, True, False, ReapDecision.RETRY),
        (Step.PREPARING, False, False, False, False, ReapDecision.FAIL),
        (Step.SUBMITTING, False, False, True, False, ReapDecision.ATTENTION),
        (Step.SUBMITTING, False, True, True, False, ReapDecision.ATTENTION),
        (Step.SUBMITTING, False, False, True, True, ReapDecision.RETRY),
        (Step.GENERATING, True, False, False, False, ReapDecision.RESUME),
        (Step.STORING, True, False, True, False, ReapDecision.RESUME),
        (Step.GENERATING, True, True, True, False, ReapDecision.CANCEL),
    ],
)
def test_reaper_decisions(
    step: Step,
    has_request: bool,
    cancel: bool,
    left: bool,
    idempotent: bool,
    decision: ReapDecision,
) -> None:
    assert reap_decision(step, has_request, cancel, left, idempotent) is decision


def test_backoff_is_jittered_and_capped() -> None:
    rng = random.Random(1)
    delays = [backoff(attempt, 2, 60, rng) for attempt in range(1, 12)]
    assert all(timedelta(0) <= d <= timedelta(seconds=60) for d in delays)
    assert all(backoff(1, 2, 60, rng) <= timedelta(seconds=2) for _ in range(100))
    assert len({d.total_seconds() for d in delays}) == len(delays)


def test_a_missing_side_is_required_and_a_negative_one_is_not_a_size() -> None:
    def said(**changes: object) -> list[tuple[str, str]]:
        _, problems = submission.validate(**{**VALID, **changes})  # type: ignore[arg-type]
        return [(p.field, p.description) for p in problems]

    assert said(width=0) == [("width", "is required (pixels)")]
    assert said(height=-1) == [("height", "must be a positive number of pixels")]

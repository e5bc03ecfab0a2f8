"""The push rules without a database: token checks, what each payload and its headers
hold (Apple's limits), and the planning rules (throttle, only on change, once per entry
into NEEDS_ATTENTION, no push-to-start when an activity exists, ends supersede)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from atelier.creation.v1 import job_pb2
from services.notify.projection import AppliedState, Moved
from services.notify.pushes import payloads, texts, tokens
from services.notify.pushes.planning import Plan, Prior, Rules, Token, at_registration, plan

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RULES = Rules(update_interval=timedelta(seconds=5), dismiss_after=timedelta(minutes=15))
JOB = "6f1c2a3e-0000-4000-8000-000000000001"
DEVICE = Token("d", "u", "device", "dev.atelier.app", "fr_CA", None)
START = Token("s", "u", "push_to_start", "dev.atelier.app", "en", None)
ACTIVITY = Token("a", "u", "activity", "dev.atelier.app", "en", JOB)
STRANGER = Token("x", "other", "device", "dev.atelier.app", "en", None)


def moved(
    version: int,
    status: job_pb2.JobStatus.ValueType,
    previous: str | None,
    progress: int = 0,
) -> Moved:
    state = job_pb2.Job(
        job_id=JOB, user_id="u", version=version, status=status, progress_percent=progress
    )
    return Moved(AppliedState(state, version), previous)


@pytest.mark.parametrize(
    ("token", "ok"),
    [
        ("ab" * 32, True),
        ("AB" * 100, True),
        ("ab" * 31, False),
        ("ab" * 101, False),
        ("a" * 65, False),
        ("g" * 64, False),
        ("", False),
        (" " + "a" * 63, False),
    ],
)
def test_tokens_are_hex_of_an_even_length_from_64_to_200(token: str, ok: bool) -> None:
    assert (tokens.token_problem(token) is None) is ok


def test_a_log_shows_only_the_first_8_characters_of_a_token() -> None:
    assert tokens.short("0123456789abcdef" * 4) == "01234567"


def test_alerts_are_localised_by_the_primary_language_and_fall_back_to_english() -> None:
    assert texts.language("fr_CA") == "fr" and texts.language("FR") == "fr"
    assert texts.language("de-DE") == "en"
    assert texts.alert("en", job_pb2.JOB_STATUS_SUCCEEDED).title == "Your image is ready"


def test_alert_headers_and_payload_follow_apples_rules() -> None:
    state = moved(7, job_pb2.JOB_STATUS_SUCCEEDED, "running").applied.state
    push = payloads.alert(state, "dev.atelier.app", "fr", NOW)
    assert push.headers["apns-topic"] == "dev.atelier.app"
    assert push.headers["apns-push-type"] == "alert"
    assert push.collapse_id is not None
    assert len(push.collapse_id.encode()) <= payloads.MAX_COLLAPSE_ID_BYTES
    assert push.headers["apns-expiration"] == str(int((NOW + timedelta(hours=24)).timestamp()))
    assert push.payload["aps"]["alert"]["title"] == "Votre image est prête"
    assert push.body_size() <= payloads.MAX_PAYLOAD_BYTES


def test_live_activity_pushes_use_the_liveactivity_topic_and_priorities() -> None:
    state = moved(3, job_pb2.JOB_STATUS_RUNNING, "running", 40).applied.state
    update = payloads.live_activity_update(state, "dev.atelier.app", NOW, NOW)
    end = payloads.live_activity_end(state, "dev.atelier.app", NOW, timedelta(minutes=15))
    for push in (update, end):
        assert push.headers["apns-topic"] == "dev.atelier.app.push-type.liveactivity"
        assert push.headers["apns-push-type"] == "liveactivity"
        assert push.payload["aps"]["timestamp"] == int(NOW.timestamp())
    assert update.priority == 5 and end.priority == 10
    assert end.payload["aps"]["dismissal-date"] == int((NOW + timedelta(minutes=15)).timestamp())
    assert update.payload["aps"]["content-state"] == {
        "status": "running",
        "progress": 40,
        "attempt": 0,
        "cancelRequested": False,
    }


def kinds(result: Plan) -> list[tuple[str, str]]:
    return [(p.token_id, p.push.kind) for p in result.pushes]


def test_a_terminal_state_alerts_the_owners_devices_and_ends_the_activity() -> None:
    result = plan(
        [moved(9, job_pb2.JOB_STATUS_FAILED, "running")],
        [DEVICE, START, ACTIVITY, STRANGER],
        {},
        RULES,
        NOW,
    )
    assert kinds(result) == [("d", "alert"), ("a", "la_end")]


def test_a_deleted_jobs_tombstone_plans_nothing() -> None:
    """Deleting a finished job is one more terminal version: no second alert or end."""
    tombstone = moved(10, job_pb2.JOB_STATUS_FAILED, "failed")
    tombstone.applied.state.deleted = True
    result = plan([tombstone], [DEVICE, START, ACTIVITY], {}, RULES, NOW)
    assert result == Plan()


def test_needs_attention_alerts_once_per_entry() -> None:
    entering = plan(
        [moved(4, job_pb2.JOB_STATUS_NEEDS_ATTENTION, "running")], [DEVICE], {}, RULES, NOW
    )
    staying = plan(
        [moved(5, job_pb2.JOB_STATUS_NEEDS_ATTENTION, "needs_attention")], [DEVICE], {}, RULES, NOW
    )
    assert kinds(entering) == [("d", "alert")] and kinds(staying) == []


def test_push_to_start_only_when_the_job_starts_and_no_activity_follows_it() -> None:
    starts = plan([moved(2, job_pb2.JOB_STATUS_RUNNING, "queued")], [START], {}, RULES, NOW)
    assert kinds(starts) == [("s", "la_start")]
    progress = plan([moved(3, job_pb2.JOB_STATUS_RUNNING, "running", 10)], [START], {}, RULES, NOW)
    assert kinds(progress) == []
    followed = plan(
        [moved(2, job_pb2.JOB_STATUS_RUNNING, "queued")], [START, ACTIVITY], {}, RULES, NOW
    )
    assert kinds(followed) == [("a", "la_update")]


def prior(status: str, *, held: bool = False, progress: int = 10, sent: bool = False) -> Prior:
    return Prior(
        push_id=1,
        kind="la_update",
        status=status,
        next_attempt_at=NOW - timedelta(seconds=2),
        sent_at=NOW - timedelta(seconds=1) if sent else None,
        content_state={
            "status": "running",
            "progress": progress,
            "attempt": 0,
            "cancelRequested": False,
        },
        held=held,
    )


def update_after(last: Prior) -> tuple[list[datetime], list[int]]:
    result = plan(
        [moved(4, job_pb2.JOB_STATUS_RUNNING, "running", 50)],
        [ACTIVITY],
        {("a", JOB, "la_update"): last},
        RULES,
        NOW,
    )
    return [p.send_at for p in result.pushes], result.dropped


def test_updates_are_throttled_per_activity_and_only_sent_on_change() -> None:
    # Unchanged: nothing.
    assert update_after(prior("pending", held=True, progress=50)) == ([], [])
    # A waiting update is replaced: the newer one takes its slot.
    assert update_after(prior("pending", held=True)) == ([NOW - timedelta(seconds=2)], [1])
    # One the sender is sending: the next waits a whole interval.
    assert update_after(prior("pending", held=False)) == ([NOW + timedelta(seconds=5)], [])
    # After one went out: the interval counts from when it went.
    assert update_after(prior("sent", sent=True)) == ([NOW + timedelta(seconds=4)], [])
    # Even though the sender's claim left next_attempt_at at its lease's end.
    leased = replace(prior("sent", sent=True), next_attempt_at=NOW + timedelta(seconds=29))
    assert update_after(leased) == ([NOW + timedelta(seconds=4)], [])


def test_an_end_drops_the_update_still_waiting() -> None:
    result = plan(
        [moved(8, job_pb2.JOB_STATUS_SUCCEEDED, "running", 100)],
        [ACTIVITY],
        {("a", JOB, "la_update"): prior("pending", held=True)},
        RULES,
        NOW,
    )
    assert kinds(result) == [("a", "la_end")] and result.dropped == [1]


def state_at(
    version: int, status: job_pb2.JobStatus.ValueType, *, deleted: bool = False
) -> job_pb2.Job:
    return job_pb2.Job(job_id=JOB, user_id="u", version=version, status=status, deleted=deleted)


def test_an_end_followed_in_its_batch_by_the_deletion_still_alerts_and_ends() -> None:
    cancelled = state_at(2, job_pb2.JOB_STATUS_CANCELLED)
    tombstone = state_at(3, job_pb2.JOB_STATUS_CANCELLED, deleted=True)
    change = Moved(AppliedState(tombstone, 3), "queued", (cancelled,))
    result = plan([change], [DEVICE, ACTIVITY], {}, RULES, NOW)
    assert [(p.token_id, p.push.kind, p.version) for p in result.pushes] == [
        ("d", "alert", 2),
        ("a", "la_end", 2),
    ]


def test_a_tombstone_stands_in_for_an_end_notify_never_received() -> None:
    tombstone = state_at(3, job_pb2.JOB_STATUS_CANCELLED, deleted=True)
    for previous in ("queued", "running", None):
        result = plan(
            [Moved(AppliedState(tombstone, 3), previous)], [DEVICE, ACTIVITY], {}, RULES, NOW
        )
        assert kinds(result) == [("d", "alert"), ("a", "la_end")], previous


def test_every_alerting_state_of_a_batch_alerts() -> None:
    attention = state_at(3, job_pb2.JOB_STATUS_NEEDS_ATTENTION)
    failed = state_at(4, job_pb2.JOB_STATUS_FAILED)
    result = plan(
        [Moved(AppliedState(failed, 4), "running", (attention,))], [DEVICE], {}, RULES, NOW
    )
    assert [p.payload["status"] for p in (q.push for q in result.pushes)] == [
        "needs_attention",
        "failed",
    ]


def test_entering_needs_attention_updates_the_activity_at_once_at_high_priority() -> None:
    result = plan(
        [moved(4, job_pb2.JOB_STATUS_NEEDS_ATTENTION, "running", 10)],
        [ACTIVITY],
        {("a", JOB, "la_update"): prior("pending", held=False)},
        RULES,
        NOW,
    )
    [update] = result.pushes
    assert update.send_at == NOW and update.push.priority == 10
    assert update.push.headers["apns-priority"] == "10"
    assert update.push.payload["aps"]["content-state"]["status"] == "needs_attention"


def test_every_live_activity_payload_has_a_stale_date() -> None:
    running = moved(3, job_pb2.JOB_STATUS_RUNNING, "running", 40).applied.state
    running.update_time.FromDatetime(NOW)
    stamp = int(NOW.timestamp())
    update = payloads.live_activity_update(running, "b.c", NOW, NOW)
    start = payloads.live_activity_start(running, "b.c", "en", NOW)
    end = payloads.live_activity_end(running, "b.c", NOW, timedelta(minutes=15))
    assert update.payload["aps"]["stale-date"] == stamp + 300
    assert start.payload["aps"]["stale-date"] == stamp + 300
    assert end.payload["aps"]["stale-date"] == end.payload["aps"]["dismissal-date"]
    retry = state_at(4, job_pb2.JOB_STATUS_QUEUED)
    retry.update_time.FromDatetime(NOW)
    retry.next_attempt_time.FromDatetime(NOW + timedelta(minutes=2))
    assert payloads.stale_date(retry, NOW) == stamp + 120 + 300


def test_a_late_registration_gets_the_current_state_unless_a_start_showed_it() -> None:
    running = moved(3, job_pb2.JOB_STATUS_RUNNING, "running", 10).applied.state
    fresh = at_registration(running, ACTIVITY, None, RULES, NOW)
    assert [(p.push.kind, p.send_at) for p in fresh.pushes] == [("la_update", NOW)]
    started = replace(prior("sent", sent=True), kind="la_start")
    assert at_registration(running, ACTIVITY, started, RULES, NOW) == Plan()
    done = state_at(5, job_pb2.JOB_STATUS_SUCCEEDED)
    assert [p.push.kind for p in at_registration(done, ACTIVITY, None, RULES, NOW).pushes] == [
        "la_end"
    ]

"""The fake vendors speak the vendors' documented protocols: checked here with plain httpx
against what Replicate's and fal's documentation say (see the fakes' module docstrings),
so a test of an adapter against a fake tests it against the protocol."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image, ImageOps

from tests.support import pictures
from tests.support.fakes.fal_api import FalFake
from tests.support.fakes.replicate_api import ReplicateFake
from tests.support.fakes.runner import FileHost

REPLICATE_TOKEN = "r8_test_token"
FAL_KEY = "key-id:key-secret"
PHOTO = pictures.encode(pictures.scene())
DATA_URI = "data:image/png;base64," + base64.b64encode(PHOTO).decode()


def styled(photo: bytes) -> Image.Image:
    """What the fakes' model does to a photo (one output)."""
    return ImageOps.mirror(ImageOps.invert(pictures.decode(photo)))


@pytest.fixture
def replicate() -> Iterator[ReplicateFake]:
    fake = ReplicateFake(REPLICATE_TOKEN, tag_header="x-client-tag")
    fake.pace(start_delay=0.05, duration=0.3, steps=6)
    with fake:
        yield fake


@pytest.fixture
def fal() -> Iterator[FalFake]:
    fake = FalFake(FAL_KEY, tag_header="x-client-tag")
    fake.pace(start_delay=0.05, duration=0.3, steps=6)
    with fake:
        yield fake


@pytest.fixture
def host() -> Iterator[FileHost]:
    with FileHost({"photo.png": (PHOTO, "image/png")}) as served:
        yield served


def replicate_client(fake: ReplicateFake, tag: str = "one") -> httpx.Client:
    return httpx.Client(
        base_url=fake.url,
        headers={"Authorization": f"Bearer {REPLICATE_TOKEN}", "X-Client-Tag": tag},
        timeout=10,
    )


def fal_client(fake: FalFake, tag: str = "one") -> httpx.Client:
    return httpx.Client(
        base_url=fake.url,
        headers={"Authorization": f"Key {FAL_KEY}", "X-Client-Tag": tag},
        timeout=10,
    )


def wait_until_ended(fake: ReplicateFake | FalFake, generation_id: str) -> None:
    fake.wait_for(lambda: fake.phase_of(generation_id) not in ("queued", "running"), timeout=10)


def poll_prediction(client: httpx.Client, url: str) -> list[dict[str, Any]]:
    """Every distinct state the prediction shows until it ends."""
    seen: list[dict[str, Any]] = []
    for _ in range(1000):
        prediction = client.get(url).json()
        if (
            not seen
            or prediction["status"] != seen[-1]["status"]
            or (prediction["logs"] != seen[-1]["logs"])
        ):
            seen.append(prediction)
        if prediction["status"] in ("succeeded", "failed", "canceled"):
            return seen
    raise AssertionError("the prediction never ended")


# ---- Replicate -------------------------------------------------------------------------


def test_replicate_prediction_runs_through_its_statuses_to_a_real_output(
    replicate: ReplicateFake,
) -> None:
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "5c7d5dc6", "input": {"image": DATA_URI}}
        )
        assert created.status_code == 201
        prediction = created.json()
        assert prediction["status"] == "starting"
        assert prediction["output"] is None and prediction["error"] is None
        assert prediction["urls"]["get"] == f"{replicate.url}/v1/predictions/{prediction['id']}"
        assert prediction["urls"]["cancel"].endswith(f"/v1/predictions/{prediction['id']}/cancel")

        seen = poll_prediction(client, prediction["urls"]["get"])

    statuses = [state["status"] for state in seen]
    assert statuses[-1] == "succeeded"
    assert set(statuses) <= {"starting", "processing", "succeeded"}
    assert "processing" in statuses
    final = seen[-1]
    # Progress shows in the logs as tqdm lines; the last one says every step is done.
    assert final["logs"].splitlines()[-1].startswith("100%|")
    assert final["metrics"]["predict_time"] > 0
    assert final["completed_at"] and final["started_at"]
    [url] = final["output"]
    image = httpx.get(url)
    assert image.status_code == 200
    assert image.headers["content-type"] == "image/png"
    output = pictures.decode(image.content)
    assert pictures.mean_difference(output, styled(PHOTO)) < 1
    assert pictures.mean_difference(output, pictures.decode(PHOTO)) > 40


def test_replicate_official_model_route_and_input_fetched_from_a_url(
    replicate: ReplicateFake, host: FileHost
) -> None:
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/models/black-forest-labs/flux-kontext/predictions",
            json={"input": {"input_image": f"{host.url}/photo.png", "num_outputs": 2}},
        )
        assert created.status_code == 201
        assert created.json()["model"] == "black-forest-labs/flux-kontext"
        final = poll_prediction(client, created.json()["urls"]["get"])[-1]
    assert final["status"] == "succeeded"
    assert host.fetches == ["photo.png"]
    assert len(final["output"]) == 2
    first = pictures.decode(httpx.get(final["output"][0]).content)
    assert pictures.mean_difference(first, styled(PHOTO)) < 1


def test_replicate_input_url_that_refuses_fails_the_prediction(
    replicate: ReplicateFake, host: FileHost
) -> None:
    host.refuse["photo.png"] = 403
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "v", "input": {"image": f"{host.url}/photo.png"}}
        )
        final = poll_prediction(client, created.json()["urls"]["get"])[-1]
    assert final["status"] == "failed"
    assert "403" in final["error"]
    assert final["output"] is None


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Key {REPLICATE_TOKEN}"])
def test_replicate_refuses_a_missing_or_wrong_token_with_its_401_body(
    replicate: ReplicateFake, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.post(
        f"{replicate.url}/v1/predictions",
        json={"version": "v", "input": {"image": DATA_URI}},
        headers=headers,
    )
    assert answer.status_code == 401
    assert answer.json() == {
        "title": "Unauthenticated",
        "detail": "You did not pass a valid authentication token",
        "status": 401,
    }
    assert replicate.submit_count() == 0
    assert httpx.get(f"{replicate.url}/v1/predictions/x", headers=headers).status_code == 401


def test_replicate_validation_and_unknown_prediction_errors(replicate: ReplicateFake) -> None:
    with replicate_client(replicate) as client:
        no_input = client.post("/v1/predictions", json={"version": "v"})
        assert no_input.status_code == 422
        assert no_input.json()["title"] == "Input validation failed"
        assert no_input.json()["invalid_fields"][0]["field"] == "input"
        assert client.get("/v1/predictions/nope").json() == {"detail": "Not found."}
        assert client.post("/v1/predictions/nope/cancel").status_code == 404
    replicate.known_versions = {"good"}
    with replicate_client(replicate) as client:
        unknown = client.post("/v1/predictions", json={"version": "bad", "input": {}})
    assert unknown.status_code == 422
    assert unknown.json()["title"] == "Invalid version or not permitted"


def test_replicate_throttles_with_retry_after_then_serves(replicate: ReplicateFake) -> None:
    replicate.throttle(times=2, retry_after=3, on=["create"])
    body = {"version": "v", "input": {"image": DATA_URI}}
    with replicate_client(replicate) as client:
        for _ in range(2):
            throttled = client.post("/v1/predictions", json=body)
            assert throttled.status_code == 429
            assert throttled.headers["Retry-After"] == "3"
            assert throttled.json() == {
                "detail": "Request was throttled. Expected available in 3 seconds."
            }
        assert client.post("/v1/predictions", json=body).status_code == 201
    assert replicate.submit_count() == 1
    assert [r.status for r in replicate.requests_for("create")] == [429, 429, 201]


def test_replicate_server_errors_on_polls_then_serves(replicate: ReplicateFake) -> None:
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}}
        )
        replicate.server_errors(times=2, status=502, on=["get"])
        url = created.json()["urls"]["get"]
        assert [client.get(url).status_code for _ in range(3)] == [502, 502, 200]


def test_replicate_failure_carries_the_error(replicate: ReplicateFake) -> None:
    replicate.fail_next("CUDA out of memory")
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}}
        )
        final = poll_prediction(client, created.json()["urls"]["get"])[-1]
    assert final["status"] == "failed"
    assert final["error"] == "CUDA out of memory"
    assert final["output"] is None


def test_replicate_cancel_mid_run_and_after_the_end(replicate: ReplicateFake) -> None:
    replicate.hold(progress=50)
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}}
        )
        prediction_id = created.json()["id"]
        replicate.wait_for(lambda: replicate.phase_of(prediction_id) == "running")
        held = client.get(f"/v1/predictions/{prediction_id}").json()
        assert held["status"] == "processing"
        canceled = client.post(created.json()["urls"]["cancel"])
        assert canceled.status_code == 200
        assert canceled.json()["status"] == "canceled"
        assert client.get(f"/v1/predictions/{prediction_id}").json()["status"] == "canceled"
        assert replicate.cancels == [prediction_id]

        replicate.release()
        done = client.post("/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}})
        wait_until_ended(replicate, done.json()["id"])
        again = client.post(done.json()["urls"]["cancel"])
    assert again.status_code == 200
    assert again.json()["status"] == "succeeded"


def test_replicate_prefer_wait_answers_the_finished_prediction(replicate: ReplicateFake) -> None:
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions",
            json={"version": "v", "input": {"image": DATA_URI}},
            headers={"Prefer": "wait=5"},
        )
    assert created.status_code == 201
    assert created.json()["status"] == "succeeded"
    assert created.headers["Location"] == created.json()["urls"]["get"]


def test_replicate_lost_submit_leaves_a_running_prediction(replicate: ReplicateFake) -> None:
    replicate.lose_submit_responses()
    with replicate_client(replicate) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}})
        [submit] = replicate.submits
        assert submit.response_lost
        wait_until_ended(replicate, submit.generation_id)
        assert client.get(f"/v1/predictions/{submit.generation_id}").json()["status"] == "succeeded"
        # The orphan shows in the list, the only place a client could find it again.
        listed = client.get("/v1/predictions").json()["results"]
    assert [p["id"] for p in listed] == [submit.generation_id]


def test_replicate_lost_submit_can_hang_until_the_client_gives_up(
    replicate: ReplicateFake,
) -> None:
    replicate.lose_submit_responses(mode="hang", hang_seconds=5)
    with (
        httpx.Client(
            base_url=replicate.url,
            headers={"Authorization": f"Bearer {REPLICATE_TOKEN}"},
            timeout=httpx.Timeout(10, read=0.3),
        ) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}})
    assert replicate.submit_count() == 1


def test_replicate_outputs_expired_at_completion_answer_404(replicate: ReplicateFake) -> None:
    replicate.expire_outputs_at_completion()
    with replicate_client(replicate) as client:
        created = client.post(
            "/v1/predictions", json={"version": "v", "input": {"image": DATA_URI}}
        )
        final = poll_prediction(client, created.json()["urls"]["get"])[-1]
    assert final["status"] == "succeeded"
    assert httpx.get(final["output"][0]).status_code == 404


def test_replicate_measures_in_flight_predictions_per_client_tag(replicate: ReplicateFake) -> None:
    replicate.hold(progress=10)
    body = {"version": "v", "input": {"image": DATA_URI}}
    with replicate_client(replicate, "a") as a, replicate_client(replicate, "b") as b:
        for _ in range(3):
            assert a.post("/v1/predictions", json=body).status_code == 201
        assert b.post("/v1/predictions", json=body).status_code == 201
        replicate.release()
        for generation_id in list(replicate.generations):
            wait_until_ended(replicate, generation_id)
        # One after another: no overlap, so the peaks stay.
        for _ in range(2):
            created = b.post("/v1/predictions", json=body).json()
            wait_until_ended(replicate, created["id"])
    assert replicate.max_in_flight() == {"a": 3, "b": 1}
    assert replicate.submit_count(lambda submit: submit.tag == "b") == 3


def test_replicate_fake_runs_as_a_subprocess_scripted_over_http() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fakes.replicate_api", "--token", "t"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = json.loads(process.stdout.readline())["url"]
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}) as client:
            control = client.post(
                "/_fake/control",
                json={"method": "throttle", "kwargs": {"times": 1, "retry_after": 2}},
            )
            assert control.status_code == 200
            body = {"version": "v", "input": {"image": DATA_URI}}
            assert client.post("/v1/predictions", json=body).status_code == 429
            created = client.post("/v1/predictions", json=body)
            assert created.status_code == 201
            assert created.json()["urls"]["get"].startswith(url)
            state = client.get("/_fake/state").json()
        assert [submit["id"] for submit in state["submits"]] == [created.json()["id"]]
    finally:
        process.terminate()
        process.wait(timeout=10)


# ---- fal -------------------------------------------------------------------------------


def test_fal_request_goes_through_the_queue_to_a_real_image(fal: FalFake) -> None:
    fal.pace(start_delay=0.1, duration=0.3, steps=6)
    with fal_client(fal) as client:
        submitted = client.post("/fal-ai/flux-pro/kontext", json={"image_url": DATA_URI})
        assert submitted.status_code == 200
        queued = submitted.json()
        assert queued["status"] == "IN_QUEUE"
        request_id = queued["request_id"]
        # The status, result and cancel URLs name the app without the endpoint path.
        base = f"{fal.url}/fal-ai/flux-pro/requests/{request_id}"
        assert queued["response_url"] == base
        assert queued["status_url"] == f"{base}/status"
        assert queued["cancel_url"] == f"{base}/cancel"

        statuses: list[tuple[int, str]] = []
        while True:
            status = client.get(queued["status_url"], params={"logs": 1})
            body = status.json()
            if not statuses or statuses[-1] != (status.status_code, body["status"]):
                statuses.append((status.status_code, body["status"]))
            if body["status"] == "IN_QUEUE":
                assert body["queue_position"] == 0
            if body["status"] == "COMPLETED":
                break
        assert statuses[0] == (202, "IN_QUEUE")
        assert (202, "IN_PROGRESS") in statuses
        assert statuses[-1] == (200, "COMPLETED")
        assert body["logs"][-1]["message"].startswith("100%|")
        assert body["metrics"]["inference_time"] > 0

        result = client.get(queued["response_url"])
    assert result.status_code == 200
    [image] = result.json()["images"]
    assert image["content_type"] == "image/png"
    assert (image["width"], image["height"]) == (96, 64)
    fetched = httpx.get(image["url"])
    assert fetched.status_code == 200
    assert image["file_size"] == len(fetched.content)
    assert pictures.mean_difference(pictures.decode(fetched.content), styled(PHOTO)) < 1


def test_fal_status_with_the_endpoint_path_is_not_found(fal: FalFake) -> None:
    with fal_client(fal) as client:
        request_id = client.post("/fal-ai/flux/dev", json={"image_url": DATA_URI}).json()[
            "request_id"
        ]
        assert client.get(f"/fal-ai/flux/dev/requests/{request_id}/status").status_code == 404
        assert client.get(f"/fal-ai/flux/requests/{request_id}/status").status_code in (200, 202)
        assert client.get("/fal-ai/flux/requests/unknown/status").status_code == 404


def test_fal_queue_position_counts_requests_ahead(fal: FalFake) -> None:
    fal.pace(start_delay=30, duration=0.1)
    with fal_client(fal) as client:
        first = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        second = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        assert second["queue_position"] == 1
        status = client.get(second["status_url"])
        assert status.status_code == 202
        assert status.json()["queue_position"] == 1
        assert client.put(first["cancel_url"]).status_code == 202
        assert client.get(second["status_url"]).json()["queue_position"] == 0


@pytest.mark.parametrize("authorization", [None, "Key wrong:key", f"Bearer {FAL_KEY}"])
def test_fal_refuses_a_missing_or_wrong_key_with_its_401_body(
    fal: FalFake, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.post(f"{fal.url}/fal-ai/flux", json={"image_url": DATA_URI}, headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {"detail": "No user found for Key ID and Secret"}
    assert fal.submit_count() == 0


def test_fal_cancel_answers_by_state(fal: FalFake) -> None:
    fal.hold(progress=50)
    with fal_client(fal) as client:
        held = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        fal.wait_for(lambda: fal.phase_of(held["request_id"]) == "running")
        assert client.get(held["status_url"]).json()["status"] == "IN_PROGRESS"
        canceled = client.put(held["cancel_url"])
        assert (canceled.status_code, canceled.json()) == (
            202,
            {"status": "CANCELLATION_REQUESTED"},
        )
        assert client.get(held["status_url"]).json()["status"] == "COMPLETED"
        assert client.get(held["response_url"]).status_code == 400
        fal.release()

        done = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        wait_until_ended(fal, done["request_id"])
        late = client.put(done["cancel_url"])
        assert (late.status_code, late.json()) == (400, {"status": "ALREADY_COMPLETED"})
        missing = client.put("/fal-ai/flux/requests/unknown/cancel")
    assert (missing.status_code, missing.json()) == (404, {"status": "NOT_FOUND"})
    assert fal.cancels == [
        held["request_id"],
        done["request_id"],
    ]


def test_fal_model_and_infrastructure_errors(fal: FalFake, host: FileHost) -> None:
    fal.fail_next(
        "content policy violation",
        status=422,
        error_type="content_policy_violation",
        retryable=False,
    )
    fal.fail_next("runner went away", status=503, error_type="runner_disconnected")
    host.refuse["photo.png"] = 403
    with fal_client(fal) as client:
        model_error = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        infra_error = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        bad_input = client.post("/fal-ai/flux", json={"image_url": f"{host.url}/photo.png"}).json()
        for request in (model_error, infra_error, bad_input):
            wait_until_ended(fal, request["request_id"])

        status = client.get(model_error["status_url"]).json()
        assert (status["status"], status["error_type"]) == ("COMPLETED", "content_policy_violation")
        answer = client.get(model_error["response_url"])
        assert answer.status_code == 422
        assert answer.headers["X-Fal-Retryable"] == "false"
        assert answer.json()["detail"][0]["type"] == "content_policy_violation"

        answer = client.get(infra_error["response_url"])
        assert answer.status_code == 503
        assert answer.headers["X-Fal-Error-Type"] == "runner_disconnected"
        assert answer.json() == {"detail": "runner went away", "error_type": "runner_disconnected"}

        answer = client.get(bad_input["response_url"])
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "image_url"]
    assert "403" in answer.json()["detail"][0]["msg"]


def test_fal_throttles_and_fails_submits_on_script(fal: FalFake) -> None:
    fal.throttle(times=1, retry_after=2, on=["create"])
    fal.server_errors(times=1, status=500, on=["create"])
    with fal_client(fal) as client:
        throttled = client.post("/fal-ai/flux", json={"image_url": DATA_URI})
        assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "2")
        assert client.post("/fal-ai/flux", json={"image_url": DATA_URI}).status_code == 500
        assert client.post("/fal-ai/flux", json={"image_url": DATA_URI}).status_code == 200
    assert fal.submit_count() == 1


def test_fal_lifecycle_header_and_forced_expiry_kill_output_urls(fal: FalFake) -> None:
    with fal_client(fal) as client:
        short = client.post(
            "/fal-ai/flux",
            json={"image_url": DATA_URI},
            headers={"X-Fal-Object-Lifecycle-Preference": '{"expiration_duration_seconds": 0}'},
        ).json()
        kept = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        fal.expire_outputs_at_completion()
        forced = client.post("/fal-ai/flux", json={"image_url": DATA_URI}).json()
        answers = {}
        for name, request in (("short", short), ("kept", kept), ("forced", forced)):
            wait_until_ended(fal, request["request_id"])
            url = client.get(request["response_url"]).json()["images"][0]["url"]
            answers[name] = httpx.get(url).status_code
    assert answers == {"short": 404, "kept": 200, "forced": 404}


def test_fal_lost_submit_leaves_a_request_in_the_queue(fal: FalFake) -> None:
    fal.lose_submit_responses()
    with fal_client(fal) as client, pytest.raises(httpx.RemoteProtocolError):
        client.post(
            "/fal-ai/flux",
            json={"image_url": DATA_URI},
            params={"fal_webhook": "https://x/y?job=7"},
        )
    [submit] = fal.submits
    assert submit.response_lost and submit.query == {"fal_webhook": "https://x/y?job=7"}
    wait_until_ended(fal, submit.generation_id)
    assert fal.phase_of(submit.generation_id) == "succeeded"

"""The fal adapter against a scripted fal queue (httpx.MockTransport): submit to the model
id, poll and fetch by the owner/app request path fal hands back, and how each answer
lands on the failure table."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from services.creation.providers.base import (
    Done,
    Failed,
    ProviderError,
    Running,
    lookup_note,
    lookup_of,
)
from services.creation.providers.fal import FalProvider
from services.creation.settings import ProviderSettings
from tests.unit.hosted_kit import (
    FAL_KEY,
    OUTPUT_PNG,
    PHOTO,
    Vendor,
    files,
    raising,
    request,
    settings,
)

MODEL = "fal-ai/flux/dev/image-to-image"
PATH = "fal-ai/flux/requests/r-1"


def queued(request_id: str = "r-1") -> dict[str, Any]:
    base = f"https://queue.fal.test/fal-ai/flux/requests/{request_id}"
    return {
        "request_id": request_id,
        "response_url": base,
        "status_url": f"{base}/status",
        "cancel_url": f"{base}/cancel",
        "status": "IN_QUEUE",
        "queue_position": 0,
    }


def provider(vendor: Vendor, outputs: httpx.MockTransport | None = None) -> FalProvider:
    return FalProvider(settings(), transport=vendor.transport, output_transport=outputs or files())


async def test_submit_posts_the_model_input_and_keeps_fals_owner_app_request_path() -> None:
    vendor = Vendor()
    vendor.on("POST", f"/{MODEL}", httpx.Response(200, json=queued()))
    adapter = provider(vendor)
    assert await adapter.submit(request(MODEL, num_outputs=2), "job-1:1") == PATH
    sent = vendor.seen[0]
    assert sent.headers["authorization"] == f"Key {FAL_KEY}"
    body = vendor.body()
    assert body["image_url"] == "data:image/png;base64," + base64.b64encode(PHOTO).decode()
    assert body["image_size"] == {"width": 512, "height": 384}
    assert body["num_images"] == 2 and body["prompt"] == "a cat in a hat"
    await adapter.close()


async def test_the_seeded_flux_row_sends_each_parameter_under_fals_name() -> None:
    vendor = Vendor()
    vendor.on("POST", f"/{MODEL}", httpx.Response(200, json=queued()))
    adapter = provider(vendor)
    passed = "seed,steps:num_inference_steps,guidance_scale,strength"
    row = f"{MODEL}?image=image_url&size=none&pass={passed}"
    parameters = dict(seed=2**63 - 1, steps=28, guidance_scale=3.5, strength=0.9)
    await adapter.submit(request(row, parameters=parameters), "job-1:1")
    body = vendor.body()
    assert {k: body[k] for k in ("seed", "num_inference_steps", "guidance_scale", "strength")} == {
        "seed": 2**63 - 1,
        "num_inference_steps": 28,
        "guidance_scale": 3.5,
        "strength": 0.9,
    }
    assert "steps" not in body and "image_size" not in body
    await adapter.close()


async def test_without_urls_in_the_answer_the_path_is_built_from_owner_and_app() -> None:
    vendor = Vendor()
    vendor.on("POST", f"/{MODEL}", httpx.Response(200, json={"request_id": "r-9"}))
    adapter = provider(vendor)
    assert await adapter.submit(request(MODEL), "k") == "fal-ai/flux/requests/r-9"
    await adapter.close()


async def test_status_in_queue_and_in_progress_are_running_with_progress_from_the_logs() -> None:
    vendor = Vendor()
    logs = [{"message": "step 3/20 15%"}, {"message": "step 12/20 60%"}]
    vendor.on(
        "GET",
        f"/{PATH}/status",
        httpx.Response(202, json={"status": "IN_QUEUE", "queue_position": 3}),
        httpx.Response(202, json={"status": "IN_PROGRESS", "logs": []}),
        httpx.Response(202, json={"status": "IN_PROGRESS", "logs": logs}),
    )
    adapter = provider(vendor)
    assert [await adapter.poll(PATH) for _ in range(3)] == [Running(0), Running(0), Running(60)]
    assert vendor.seen[0].url.params["logs"] == "1"
    await adapter.close()


async def test_completed_fetches_the_result_and_downloads_its_images() -> None:
    vendor = Vendor()
    vendor.on("GET", f"/{PATH}/status", httpx.Response(200, json={"status": "COMPLETED"}))
    vendor.on(
        "GET",
        f"/{PATH}",
        httpx.Response(
            200,
            json={"images": [{"url": "https://cdn.test/o.png", "content_type": "image/png"}]},
        ),
    )
    adapter = provider(vendor, files(**{"/o.png": (200, OUTPUT_PNG, "image/png")}))
    result = await adapter.poll(PATH)
    assert isinstance(result, Done) and result.outputs[0].data == OUTPUT_PNG
    # The output host never sees our key.
    await adapter.close()


async def test_a_data_uri_output_needs_no_download() -> None:
    vendor = Vendor()
    vendor.on("GET", f"/{PATH}/status", httpx.Response(200, json={"status": "COMPLETED"}))
    uri = "data:image/png;base64," + base64.b64encode(OUTPUT_PNG).decode()
    vendor.on("GET", f"/{PATH}", httpx.Response(200, json={"images": [{"url": uri}]}))
    adapter = provider(vendor)
    result = await adapter.poll(PATH)
    assert isinstance(result, Done) and result.outputs[0].width == 40
    await adapter.close()


@pytest.mark.parametrize(
    ("result", "code", "retryable"),
    [
        (
            httpx.Response(
                422,
                json={
                    "detail": [
                        {
                            "loc": ["body", "prompt"],
                            "msg": "The content was flagged by a content checker.",
                            "type": "content_policy_violation",
                        }
                    ]
                },
            ),
            "CONTENT_REJECTED",
            False,
        ),
        (
            httpx.Response(
                422,
                json={
                    "detail": [
                        {"loc": ["body", "image_url"], "msg": "x", "type": "image_load_error"}
                    ]
                },
            ),
            "INPUT_UNREADABLE",
            False,
        ),
        (
            httpx.Response(
                422,
                json={
                    "detail": [{"loc": ["body", "strength"], "msg": "x", "type": "less_than_equal"}]
                },
            ),
            "INVALID_INPUT",
            False,
        ),
        (
            httpx.Response(
                504,
                headers={"X-Fal-Error-Type": "request_timeout"},
                json={"detail": "Request timed out", "error_type": "request_timeout"},
            ),
            "TRANSIENT",
            True,
        ),
        (httpx.Response(404, json={"detail": "Not found"}), "OUTPUT_EXPIRED", False),
        (httpx.Response(400, json={"detail": "Request was cancelled"}), "CANCELLED", False),
    ],
)
async def test_a_completed_request_whose_result_is_an_error_maps_onto_the_table(
    result: httpx.Response, code: str, retryable: bool
) -> None:
    vendor = Vendor()
    vendor.on("GET", f"/{PATH}/status", httpx.Response(200, json={"status": "COMPLETED"}))
    vendor.on("GET", f"/{PATH}", result)
    adapter = provider(vendor)
    failed = await adapter.poll(PATH)
    assert isinstance(failed, Failed)
    assert (failed.code, failed.retryable) == (code, retryable)
    await adapter.close()


async def test_a_completed_status_that_carries_an_error_fails_without_fetching() -> None:
    vendor = Vendor()
    vendor.on(
        "GET",
        f"/{PATH}/status",
        httpx.Response(
            200,
            json={
                "status": "COMPLETED",
                "error": "Runner disconnected",
                "error_type": "runner_disconnected",
            },
        ),
    )
    adapter = provider(vendor)
    failed = await adapter.poll(PATH)
    assert isinstance(failed, Failed) and (failed.code, failed.retryable) == ("TRANSIENT", True)
    assert [r.url.path for r in vendor.seen] == [f"/{PATH}/status"]
    await adapter.close()


async def test_a_bare_gateway_error_on_the_result_is_a_call_failure_polled_again() -> None:
    vendor = Vendor()
    vendor.on("GET", f"/{PATH}/status", httpx.Response(200, json={"status": "COMPLETED"}))
    vendor.on("GET", f"/{PATH}", httpx.Response(502, text="bad gateway"))
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.poll(PATH)
    assert raised.value.code == "UNAVAILABLE" and raised.value.retryable
    await adapter.close()


async def test_an_unknown_request_is_request_unknown() -> None:
    vendor = Vendor()
    vendor.on("GET", f"/{PATH}/status", httpx.Response(404, json={"detail": "Request not found"}))
    adapter = provider(vendor)
    failed = await adapter.poll(PATH)
    assert isinstance(failed, Failed) and failed.code == "REQUEST_UNKNOWN" and failed.retryable
    await adapter.close()


@pytest.mark.parametrize(
    ("answer", "code", "unknown", "retry_after"),
    [
        (httpx.Response(429, headers={"Retry-After": "4"}), "RATE_LIMITED", False, 4.0),
        (
            httpx.Response(503, json={"detail": "x", "error_type": "runner_scheduling_failure"}),
            "UNAVAILABLE",
            False,
            None,
        ),
        (
            httpx.Response(401, json={"detail": "No user found for Key ID and Secret"}),
            "AUTH_REJECTED",
            False,
            None,
        ),
        (
            httpx.Response(404, json={"detail": "Application not found"}),
            "INVALID_INPUT",
            False,
            None,
        ),
        (httpx.Response(504), "TIMEOUT", True, None),
    ],
)
async def test_submit_answers_map_onto_the_table(
    answer: httpx.Response, code: str, unknown: bool, retry_after: float | None
) -> None:
    vendor = Vendor()
    vendor.on("POST", f"/{MODEL}", answer)
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(request(MODEL), "k")
    error = raised.value
    assert (error.code, error.outcome_unknown, error.retry_after_seconds) == (
        code,
        unknown,
        retry_after,
    )
    assert FAL_KEY not in str(error)
    await adapter.close()


@pytest.mark.parametrize(
    ("failure", "unknown"),
    [(httpx.ConnectError, False), (httpx.ReadTimeout, True), (httpx.RemoteProtocolError, True)],
)
async def test_a_lost_submit_is_unknown_only_once_sent(
    failure: type[httpx.TransportError], unknown: bool
) -> None:
    vendor = Vendor()
    vendor.on("POST", f"/{MODEL}", raising(failure))
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(request(MODEL), "k")
    assert raised.value.outcome_unknown is unknown
    await adapter.close()


async def test_cancel_puts_to_the_request_and_an_already_completed_one_is_fine() -> None:
    vendor = Vendor()
    vendor.on(
        "PUT", f"/{PATH}/cancel", httpx.Response(202, json={"status": "CANCELLATION_REQUESTED"})
    )
    vendor.on(
        "PUT",
        "/fal-ai/flux/requests/r-2/cancel",
        httpx.Response(400, json={"status": "ALREADY_COMPLETED"}),
    )
    adapter = provider(vendor)
    await adapter.cancel(PATH)
    await adapter.cancel("fal-ai/flux/requests/r-2")
    assert [r.method for r in vendor.seen] == ["PUT", "PUT"]
    await adapter.close()


async def test_fal_cannot_look_a_request_up_by_our_reference() -> None:
    adapter = FalProvider(ProviderSettings())
    await adapter.close()
    assert lookup_of(adapter) is None
    assert "fal's dashboard" in lookup_note(adapter)

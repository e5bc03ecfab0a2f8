"""The Replicate adapter against a scripted Replicate (httpx.MockTransport): the routes it
picks from the catalog's provider_model, what it sends, and how every answer lands on the
failure table — above all, which submits leave an unknown outcome."""

from __future__ import annotations

import base64
import logging
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
from services.creation.providers.replicate import ReplicateProvider, create_route
from services.creation.settings import ProviderSettings, VendorSettings
from tests.unit.hosted_kit import (
    OUTPUT_JPEG,
    OUTPUT_PNG,
    PHOTO,
    REPLICATE_TOKEN,
    Vendor,
    files,
    raising,
    request,
    settings,
)

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"


def prediction(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "p-1", "status": status, "logs": "", "output": None, "error": None, **fields}


def provider(
    vendor: Vendor, outputs: httpx.MockTransport | None = None, **changes: Any
) -> ReplicateProvider:
    return ReplicateProvider(
        settings(**changes), transport=vendor.transport, output_transport=outputs or files()
    )


# --- routes and what is sent -------------------------------------------------------------


def test_an_owner_and_name_is_an_official_model_and_a_version_goes_to_predictions() -> None:
    assert create_route("black-forest-labs/flux-schnell") == (
        "/v1/models/black-forest-labs/flux-schnell/predictions",
        {},
    )
    assert create_route(f"stability-ai/sdxl:{VERSION}") == ("/v1/predictions", {"version": VERSION})
    assert create_route(VERSION) == ("/v1/predictions", {"version": VERSION})


async def test_submit_sends_the_input_inline_with_our_bearer_token_and_process_header() -> None:
    vendor = Vendor()
    vendor.on(
        "POST",
        "/v1/models/acme/restyle/predictions",
        httpx.Response(201, json=prediction("starting")),
    )
    adapter = provider(vendor)
    assert await adapter.submit(request("acme/restyle?image=input_image"), "job-1:1") == "p-1"
    sent = vendor.seen[0]
    assert sent.headers["authorization"] == f"Bearer {REPLICATE_TOKEN}"
    assert sent.headers["x-atelier-process"]
    body = vendor.body()
    assert "version" not in body
    image = body["input"]["input_image"]
    assert image == "data:image/png;base64," + base64.b64encode(PHOTO).decode()
    assert body["input"]["prompt"] == "a cat in a hat"
    assert (body["input"]["width"], body["input"]["height"]) == (512, 384)
    assert "num_outputs" not in body["input"] and "negative_prompt" not in body["input"]
    await adapter.close()


async def test_a_version_route_sends_the_version_and_a_signed_url_replaces_the_bytes() -> None:
    vendor = Vendor()
    vendor.on("POST", "/v1/predictions", httpx.Response(201, json=prediction("starting")))
    adapter = provider(vendor)
    await adapter.submit(
        request(
            f"stability-ai/sdxl:{VERSION}?size=none&pass=seed",
            input_url="https://media.test/signed?sig=abc",
            parameters={"seed": 7, "steps": 500},
            num_outputs=2,
            negative_prompt="blurry",
        ),
        "job-1:1",
    )
    body = vendor.body()
    assert body["version"] == VERSION
    assert body["input"]["image"] == "https://media.test/signed?sig=abc"
    # Only the listed parameters pass; our own fields win.
    assert body["input"]["seed"] == 7 and "steps" not in body["input"]
    assert "num_inference_steps" not in body["input"]
    assert body["input"]["num_outputs"] == 2 and body["input"]["negative_prompt"] == "blurry"
    assert "width" not in body["input"]
    await adapter.close()


async def test_parameters_go_under_the_vendors_names_and_a_seed_stays_exact() -> None:
    vendor = Vendor()
    vendor.on("POST", "/v1/predictions", httpx.Response(201, json=prediction("starting")))
    adapter = provider(vendor)
    model = (
        f"stability-ai/sdxl:{VERSION}?pass=seed,steps:num_inference_steps,strength:prompt_strength"
    )
    parameters = dict(seed=2**63 - 1, steps=30, strength=0.25, guidance_scale=9)
    await adapter.submit(request(model, parameters=parameters), "job-1:1")
    sent = vendor.body()["input"]
    assert (sent["seed"], sent["num_inference_steps"], sent["prompt_strength"]) == (
        2**63 - 1,
        30,
        0.25,
    )
    assert "guidance_scale" not in sent  # not in the row's pass list
    # Exact on the wire too, not a double's 9223372036854775808.
    assert b'"seed":9223372036854775807' in vendor.seen[-1].content.replace(b" ", b"")
    await adapter.close()


async def test_a_model_string_it_cannot_read_is_invalid_input_and_nothing_is_sent() -> None:
    vendor = Vendor()
    adapter = provider(vendor)
    for model in ("not a model", "acme/x:short", "acme/x?colour=red"):
        with pytest.raises(ProviderError) as raised:
            await adapter.submit(request(model), "k")
        assert raised.value.code == "INVALID_INPUT" and not raised.value.outcome_unknown
    assert vendor.seen == []
    await adapter.close()


# --- polling -----------------------------------------------------------------------------


async def test_progress_comes_from_the_last_percentage_in_the_logs() -> None:
    vendor = Vendor()
    logs = (
        "Using seed: 1\n  4%|▍         | 2/50 [00:01<00:30]\n 46%|████▌     | 23/50 [00:05<00:06]\n"
    )
    vendor.on(
        "GET",
        "/v1/predictions/p-1",
        httpx.Response(200, json=prediction("starting")),
        httpx.Response(200, json=prediction("processing", logs="")),
        httpx.Response(200, json=prediction("processing", logs=logs)),
    )
    adapter = provider(vendor)
    assert [await adapter.poll("p-1") for _ in range(3)] == [Running(0), Running(0), Running(46)]
    await adapter.close()


async def test_success_downloads_every_output_and_checks_it_is_the_image_it_says() -> None:
    vendor = Vendor()
    urls = ["https://delivery.test/a/out-0.png", "https://delivery.test/b/out-1.jpg"]
    vendor.on(
        "GET", "/v1/predictions/p-1", httpx.Response(200, json=prediction("succeeded", output=urls))
    )
    outputs = files(
        **{
            "/a/out-0.png": (200, OUTPUT_PNG, "image/png"),
            "/b/out-1.jpg": (200, OUTPUT_JPEG, "image/jpeg"),
        }
    )
    adapter = provider(vendor, outputs)
    result = await adapter.poll("p-1")
    assert isinstance(result, Done)
    assert [(o.content_type, o.width, o.height) for o in result.outputs] == [
        ("image/png", 40, 30),
        ("image/jpeg", 40, 30),
    ]
    assert result.outputs[0].data == OUTPUT_PNG
    await adapter.close()


async def test_a_single_url_output_is_one_image() -> None:
    vendor = Vendor()
    vendor.on(
        "GET",
        "/v1/predictions/p-1",
        httpx.Response(200, json=prediction("succeeded", output="https://delivery.test/o.png")),
    )
    adapter = provider(vendor, files(**{"/o.png": (200, OUTPUT_PNG, "image/png")}))
    result = await adapter.poll("p-1")
    assert isinstance(result, Done) and len(result.outputs) == 1
    await adapter.close()


@pytest.mark.parametrize(
    ("answer", "code", "retryable"),
    [
        ((404, b"", "text/plain"), "OUTPUT_EXPIRED", False),
        ((403, b"expired", "text/plain"), "OUTPUT_EXPIRED", False),
        ((200, b"<html>not an image</html>", "text/html"), "OUTPUT_INVALID", False),
        ((200, OUTPUT_JPEG, "image/png"), "OUTPUT_INVALID", False),  # says PNG, holds JPEG
        ((200, OUTPUT_PNG[: len(OUTPUT_PNG) // 2], "image/png"), "OUTPUT_INVALID", False),
        ((200, b"\0" * (2 * 1024 * 1024), "image/png"), "OUTPUT_INVALID", False),  # over cap
    ],
)
async def test_an_output_that_is_gone_or_unusable_fails_the_attempt_for_good(
    answer: tuple[int, bytes, str], code: str, retryable: bool
) -> None:
    vendor = Vendor()
    vendor.on(
        "GET",
        "/v1/predictions/p-1",
        httpx.Response(200, json=prediction("succeeded", output=["https://delivery.test/o.png"])),
    )
    adapter = provider(vendor, files(**{"/o.png": answer}))
    result = await adapter.poll("p-1")
    assert isinstance(result, Failed)
    assert (result.code, result.retryable) == (code, retryable)
    await adapter.close()


async def test_an_output_host_that_does_not_answer_is_a_call_failure_the_attempt_polls_past() -> (
    None
):
    vendor = Vendor()
    vendor.on(
        "GET",
        "/v1/predictions/p-1",
        httpx.Response(200, json=prediction("succeeded", output=["https://delivery.test/o.png"])),
    )
    for outputs in (
        files(**{"/o.png": (502, b"", "text/plain")}),
        httpx.MockTransport(raising(httpx.ConnectError)),
    ):
        adapter = provider(vendor, outputs)
        with pytest.raises(ProviderError) as raised:
            await adapter.poll("p-1")
        assert raised.value.code == "UNAVAILABLE" and raised.value.retryable
        await adapter.close()


async def test_data_removed_is_an_expired_output() -> None:
    vendor = Vendor()
    vendor.on(
        "GET",
        "/v1/predictions/p-1",
        httpx.Response(200, json=prediction("succeeded", output=None, data_removed=True)),
    )
    adapter = provider(vendor)
    result = await adapter.poll("p-1")
    assert isinstance(result, Failed) and result.code == "OUTPUT_EXPIRED" and not result.retryable
    await adapter.close()


@pytest.mark.parametrize(
    ("status", "error", "code", "retryable"),
    [
        (
            "failed",
            "NSFW content detected. Try running it again, or try a different prompt.",
            "CONTENT_REJECTED",
            False,
        ),
        ("failed", "CUDA out of memory. Tried to allocate 2.00 GiB", "TRANSIENT", True),
        ("failed", "Prediction timed out", "TRANSIENT", True),
        ("failed", "ValueError: image must be RGB", "INTERNAL", False),
        ("failed", None, "INTERNAL", False),
        ("canceled", None, "CANCELLED", False),
        ("aborted", None, "TRANSIENT", True),
    ],
)
async def test_a_prediction_that_ended_without_output_maps_onto_the_failure_table(
    status: str, error: str | None, code: str, retryable: bool
) -> None:
    vendor = Vendor()
    vendor.on(
        "GET", "/v1/predictions/p-1", httpx.Response(200, json=prediction(status, error=error))
    )
    adapter = provider(vendor)
    result = await adapter.poll("p-1")
    assert isinstance(result, Failed)
    assert (result.code, result.retryable) == (code, retryable)
    await adapter.close()


async def test_a_prediction_replicate_does_not_know_is_request_unknown() -> None:
    vendor = Vendor()
    vendor.on("GET", "/v1/predictions/p-1", httpx.Response(404, json={"detail": "Not found."}))
    adapter = provider(vendor)
    result = await adapter.poll("p-1")
    assert isinstance(result, Failed) and result.code == "REQUEST_UNKNOWN" and result.retryable
    await adapter.close()


# --- call failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "code", "retryable", "retry_after"),
    [
        (
            httpx.Response(
                429, headers={"Retry-After": "7"}, json={"detail": "Request was throttled."}
            ),
            "RATE_LIMITED",
            True,
            7.0,
        ),
        (
            httpx.Response(
                429, json={"detail": "Request was throttled. Expected available in 3 seconds."}
            ),
            "RATE_LIMITED",
            True,
            3.0,
        ),
        (httpx.Response(500, json={"detail": "Internal server error"}), "UNAVAILABLE", True, None),
        (httpx.Response(503, headers={"Retry-After": "2"}), "UNAVAILABLE", True, 2.0),
        (
            httpx.Response(
                401,
                json={
                    "title": "Unauthenticated",
                    "detail": "You did not pass a valid authentication token",
                },
            ),
            "AUTH_REJECTED",
            False,
            None,
        ),
        (httpx.Response(402, json={"detail": "Insufficient credit"}), "AUTH_REJECTED", False, None),
        (
            httpx.Response(
                422,
                json={
                    "title": "Input validation failed",
                    "detail": "- input.prompt: Invalid type",
                    "status": 422,
                },
            ),
            "INVALID_INPUT",
            False,
            None,
        ),
        (
            httpx.Response(422, json={"detail": "Invalid version or not permitted"}),
            "INVALID_INPUT",
            False,
            None,
        ),
        (httpx.Response(404, json={"detail": "Not found."}), "INVALID_INPUT", False, None),
        (
            httpx.Response(422, json={"detail": "NSFW content detected in the input image"}),
            "CONTENT_REJECTED",
            False,
            None,
        ),
    ],
)
async def test_a_submit_refused_with_an_answer_is_never_an_unknown_outcome(
    answer: httpx.Response, code: str, retryable: bool, retry_after: float | None
) -> None:
    vendor = Vendor()
    vendor.on("POST", "/v1/models/acme/restyle/predictions", answer)
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(request("acme/restyle"), "k")
    error = raised.value
    assert (error.code, error.retryable, error.retry_after_seconds) == (
        code,
        retryable,
        retry_after,
    )
    assert not error.outcome_unknown
    await adapter.close()


@pytest.mark.parametrize(
    ("failure", "code", "unknown"),
    [
        (httpx.ConnectError, "UNAVAILABLE", False),  # never left: safe to send again
        (httpx.ConnectTimeout, "TIMEOUT", False),
        (httpx.PoolTimeout, "TIMEOUT", False),
        (httpx.ReadTimeout, "TIMEOUT", True),  # sent, no answer: it may run
        (httpx.ReadError, "UNAVAILABLE", True),  # reset after sending
        (httpx.RemoteProtocolError, "UNAVAILABLE", True),
        (httpx.WriteTimeout, "TIMEOUT", True),
    ],
)
async def test_a_submit_without_an_answer_is_unknown_only_once_it_may_have_been_sent(
    failure: type[httpx.TransportError], code: str, unknown: bool
) -> None:
    vendor = Vendor()
    vendor.on("POST", "/v1/models/acme/restyle/predictions", raising(failure))
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(request("acme/restyle"), "k")
    assert (raised.value.code, raised.value.outcome_unknown) == (code, unknown)
    assert raised.value.retryable
    await adapter.close()


async def test_a_gateway_timeout_or_an_unreadable_answer_to_a_submit_is_unknown() -> None:
    for answer in (
        httpx.Response(504),
        httpx.Response(201, text="<html>"),
        httpx.Response(201, json={}),
    ):
        vendor = Vendor()
        vendor.on("POST", "/v1/models/acme/restyle/predictions", answer)
        adapter = provider(vendor)
        with pytest.raises(ProviderError) as raised:
            await adapter.submit(request("acme/restyle"), "k")
        assert raised.value.outcome_unknown
        await adapter.close()


async def test_a_poll_without_an_answer_is_a_retryable_call_failure_never_unknown() -> None:
    vendor = Vendor()
    vendor.on("GET", "/v1/predictions/p-1", raising(httpx.ReadTimeout))
    adapter = provider(vendor)
    with pytest.raises(ProviderError) as raised:
        await adapter.poll("p-1")
    assert raised.value.code == "TIMEOUT" and raised.value.retryable
    assert not raised.value.outcome_unknown
    await adapter.close()


async def test_cancel_posts_to_the_prediction_and_a_gone_prediction_is_cancelled_already() -> None:
    vendor = Vendor()
    vendor.on(
        "POST", "/v1/predictions/p-1/cancel", httpx.Response(200, json=prediction("canceled"))
    )
    vendor.on(
        "POST", "/v1/predictions/p-2/cancel", httpx.Response(404, json={"detail": "Not found."})
    )
    vendor.on("POST", "/v1/predictions/p-3/cancel", httpx.Response(500))
    adapter = provider(vendor)
    await adapter.cancel("p-1")
    await adapter.cancel("p-2")
    with pytest.raises(ProviderError):
        await adapter.cancel("p-3")
    await adapter.close()


# --- the key -----------------------------------------------------------------------------


async def test_the_token_is_in_no_error_and_no_repr() -> None:
    vendor = Vendor()
    vendor.on(
        "POST",
        "/v1/models/acme/restyle/predictions",
        httpx.Response(401, json={"detail": "bad token"}),
    )
    vendor.on("GET", "/v1/predictions/p-1", raising(httpx.ReadError))
    adapter = provider(vendor)
    texts = [repr(settings()), str(settings())]
    for call in (adapter.submit(request("acme/restyle"), "k"), adapter.poll("p-1")):
        with pytest.raises(ProviderError) as raised:
            await call
        texts += [str(raised.value), raised.value.message, repr(raised.value)]
    assert all(REPLICATE_TOKEN not in text for text in texts)
    await adapter.close()


async def test_the_token_is_in_no_log_line_whatever_the_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vendor = Vendor()
    vendor.on(
        "POST",
        "/v1/models/acme/restyle/predictions",
        httpx.Response(201, json=prediction("starting")),
    )
    vendor.on("GET", "/v1/predictions/p-1", httpx.Response(401, json={"detail": "bad token"}))
    adapter = provider(vendor)
    with caplog.at_level(logging.DEBUG):
        await adapter.submit(request("acme/restyle"), "k")
        with pytest.raises(ProviderError):
            await adapter.poll("p-1")
    assert vendor.seen[0].headers["authorization"].endswith(REPLICATE_TOKEN)
    assert all(REPLICATE_TOKEN not in record.getMessage() for record in caplog.records)
    assert REPLICATE_TOKEN not in caplog.text
    await adapter.close()


async def test_without_a_token_every_call_is_refused_before_anything_is_sent() -> None:
    vendor = Vendor()
    unset = ProviderSettings(replicate=VendorSettings("https://api.replicate.test"))
    adapter = ReplicateProvider(unset, transport=vendor.transport)
    assert not adapter.configured
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(request("acme/restyle"), "k")
    assert raised.value.code == "AUTH_REJECTED" and "ATELIER_REPLICATE_API_TOKEN" in str(
        raised.value
    )
    assert vendor.seen == []
    await adapter.close()


async def test_replicate_cannot_look_a_prediction_up_by_our_reference() -> None:
    # Replicate keeps no client reference on a prediction: no lookup, and the note says
    # where an operator looks instead.
    adapter = ReplicateProvider(ProviderSettings())
    await adapter.close()
    assert lookup_of(adapter) is None
    assert "GET /v1/predictions" in lookup_note(adapter)

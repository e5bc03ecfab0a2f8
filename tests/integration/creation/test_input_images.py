"""SubmitJob's input image through creation's real listener with a real media beside it:
a model says whether it takes, needs or refuses a photo (ListCatalog's input_image, the
refusals), a text-to-image job is made without one, and input_url has media import the
photo from a real local HTTPS server before the job is made (the imported asset is the
caller's; a replay fetches nothing; a refused URL is INPUT_URL_REFUSED naming input_url)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from atelier.creation.v1 import catalog_pb2, creation_service_pb2, creation_service_pb2_grpc
from atelier.media.v1 import asset_pb2, media_internal_service_pb2, media_internal_service_pb2_grpc
from tests.integration.creation.helpers import SERVICE, new_user, running_creation, user_token
from tests.support.https_origin import Origin, https_origin
from tests.support.media import image_bytes, media_settings, running_media
from tests.support.rpc import bad_request, error_info

PNG = image_bytes("PNG", 96, 64)


@dataclass
class Stack:
    creation: creation_service_pb2_grpc.CreationServiceStub
    media: media_internal_service_pb2_grpc.MediaInternalServiceStub
    origin: Origin


@pytest.fixture(scope="module")
async def stack(
    creation_url: str, media_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    work = tmp_path_factory.mktemp("inputs")
    async with https_origin(work) as origin:
        settings = media_settings(
            media_url,
            work,
            MEDIA_IMPORT_ALLOWED_NETWORKS="127.0.0.1/32",
            MEDIA_IMPORT_CA_FILE=str(origin.ca_file),
        )
        async with running_media(settings) as media:
            address = f"127.0.0.1:{media.running.internal_port}"
            async with (
                running_creation(creation_url, media_address=address) as creation,
                creation.public_channel() as public,
                media.internal_channel() as internal,
            ):
                yield Stack(
                    creation_service_pb2_grpc.CreationServiceStub(public),
                    media_internal_service_pb2_grpc.MediaInternalServiceStub(internal),
                    origin,
                )


def request(model_id: str = "stub-text", **fields: object) -> creation_service_pb2.SubmitJobRequest:
    values: dict[str, object] = {
        "model_id": model_id,
        "style_id": "watercolor",
        "prompt": "a lighthouse at dusk",
        "width": 512,
        "height": 384,
        **fields,
    }
    return creation_service_pb2.SubmitJobRequest(**values)  # type: ignore[arg-type]


async def submit(stack: Stack, user: str, message: creation_service_pb2.SubmitJobRequest) -> str:
    reply = await stack.creation.SubmitJob(message, metadata=user_token(user))
    return reply.job.job_id


async def refused(
    stack: Stack, user: str, message: creation_service_pb2.SubmitJobRequest
) -> tuple[grpc.StatusCode, str, list[str], dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.creation.SubmitJob(message, metadata=user_token(user))
    error = caught.value
    info = error_info(error)
    violations = bad_request(error)
    fields = [] if violations is None else [v.field for v in violations.field_violations]
    return error.code(), info.reason, fields, dict(info.metadata)


async def asset(stack: Stack, asset_id: str) -> asset_pb2.Asset:
    reply = await stack.media.GetAssetInfo(
        media_internal_service_pb2.GetAssetInfoRequest(asset_id=asset_id), metadata=SERVICE
    )
    return reply.asset


async def test_the_catalog_says_what_each_model_does_with_a_photo(stack: Stack) -> None:
    reply = await stack.creation.ListCatalog(
        creation_service_pb2.ListCatalogRequest(), metadata=user_token(new_user())
    )
    taken = {m.model_id: m.input_image for m in reply.models}
    assert taken["stub-text"] == catalog_pb2.INPUT_IMAGE_REFUSED
    assert taken["stub-fast"] == catalog_pb2.INPUT_IMAGE_REQUIRED
    assert catalog_pb2.INPUT_IMAGE_UNSPECIFIED not in taken.values()


async def test_a_text_to_image_job_needs_no_photo(stack: Stack) -> None:
    user = new_user()
    reply = await stack.creation.SubmitJob(request(), metadata=user_token(user))
    assert reply.job.model_id == "stub-text"
    assert reply.job.input_asset_id == ""
    got = await stack.creation.GetJob(
        creation_service_pb2.GetJobRequest(job_id=reply.job.job_id), metadata=user_token(user)
    )
    assert got.job.input_asset_id == ""


async def test_a_photo_model_refuses_a_request_without_one(stack: Stack) -> None:
    code, reason, fields, _ = await refused(stack, new_user(), request("stub-fast"))
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INPUT_IMAGE_REQUIRED",
        ["input_asset_id"],
    )


async def test_a_text_model_refuses_a_photo(stack: Stack) -> None:
    user = new_user()
    photo = stack.origin.image("/refused-photo.png", PNG)
    by_id = request(input_asset_id="6f1c1f43-6d3b-4c55-9a51-5c2a2b0f5a10")
    assert (await refused(stack, user, by_id))[:3] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INPUT_IMAGE_REFUSED",
        ["input_asset_id"],
    )
    assert (await refused(stack, user, request(input_url=photo)))[:3] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INPUT_IMAGE_REFUSED",
        ["input_url"],
    )
    assert "/refused-photo.png" not in stack.origin.hits


async def test_both_inputs_at_once_are_refused(stack: Stack) -> None:
    both = request(
        "stub-fast",
        input_asset_id="6f1c1f43-6d3b-4c55-9a51-5c2a2b0f5a10",
        input_url=stack.origin.url("/x.png"),
    )
    code, reason, fields, _ = await refused(stack, new_user(), both)
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_JOB_REQUEST",
        ["input_url"],
    )


async def test_an_input_url_is_imported_as_the_callers_photo(stack: Stack) -> None:
    user = new_user()
    url = stack.origin.image("/by-url.png", PNG)
    reply = await stack.creation.SubmitJob(
        request("stub-fast", input_url=url, request_id="by-url-1"), metadata=user_token(user)
    )
    imported = await asset(stack, reply.job.input_asset_id)
    assert imported.owner_user_id == user
    assert imported.purpose == asset_pb2.ASSET_PURPOSE_AI_INPUT
    assert imported.status == asset_pb2.ASSET_STATUS_READY
    assert (imported.width, imported.height) == (96, 64)
    # The same request again is the same job, and nothing is fetched again.
    again = await stack.creation.SubmitJob(
        request("stub-fast", input_url=url, request_id="by-url-1"), metadata=user_token(user)
    )
    assert again.job.job_id == reply.job.job_id
    assert stack.origin.hits.count("/by-url.png") == 1
    # The same key for another URL is another request.
    other = stack.origin.image("/by-url-other.png", PNG)
    code, reason, _, _ = await refused(
        stack, user, request("stub-fast", input_url=other, request_id="by-url-1")
    )
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED")


async def test_a_refused_url_names_input_url_and_why(stack: Stack) -> None:
    user = new_user()
    for url, cause in [
        ("http://127.0.0.1/a.png", "URL_NOT_HTTPS"),
        ("https://169.254.169.254/latest/meta-data/", "ADDRESS_NOT_ALLOWED"),
        (stack.origin.url("/nothing-here.png"), "STATUS_NOT_OK"),
    ]:
        code, reason, fields, metadata = await refused(
            stack, user, request("stub-fast", input_url=url)
        )
        assert (code, reason, fields, metadata.get("cause")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INPUT_URL_REFUSED",
            ["input_url"],
            cause,
        ), url


async def test_an_input_url_of_the_wrong_shape_is_refused_before_media(stack: Stack) -> None:
    code, reason, fields, _ = await refused(
        stack, new_user(), request("stub-fast", input_url="https://a b/" + "x" * 2050)
    )
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_JOB_REQUEST",
        ["input_url", "input_url"],
    )

"""Text-to-image and inputs by URL through the real Envoy, with creation's job engine and
the stub provider: a stub-text job runs to a picture without any photo; a job whose photo
is an https URL (a real local HTTPS server, its certificate trusted by media's test
setting) runs from the photo media imported for the caller; a refused URL or a missing
photo is a 400 with its reason and a field violation naming the field. The Python client
sends input_url, or no photo at all, and reads a refusal's reason and cause."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from atelier.creation.v1 import job_pb2
from atelier_client import AsyncClient, InvalidArgument
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User
from tests.support.https_origin import Origin, https_origin
from tests.support.pictures import encode, scene
from tests.support.stacks import job_in, stack_of_its_own


@pytest.fixture(scope="module")
async def origin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Origin]:
    async with https_origin(tmp_path_factory.mktemp("origin")) as served:
        yield served


@pytest.fixture(scope="module")
def running(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory, origin: Origin
) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("inputs")
    engine_env = {
        "ATELIER_STUB_DURATION": "1",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        # The local HTTPS server: its address allowed, its certificate trusted (tests only).
        "ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS": "127.0.0.1/32",
        "ATELIER_MEDIA_IMPORT_CA_FILE": str(origin.ca_file),
    }
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


def edge(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.ports.envoy}"


def body(model_id: str, **changes: object) -> dict[str, object]:
    return {
        "modelId": model_id,
        "styleId": "watercolor",
        "prompt": "a red kite over the sea",
        "width": 384,
        "height": 256,
        **changes,
    }


def details(response: httpx.Response) -> dict[str, Any]:
    return {d["@type"].rsplit(".", 1)[-1]: d for d in response.json()["details"]}


async def picture_of(http: httpx.AsyncClient, job: dict[str, Any]) -> Image.Image:
    download = await http.get(job["outputs"][0]["url"])
    assert download.status_code == 200
    return Image.open(io.BytesIO(download.content))


async def test_the_catalog_offers_a_model_that_needs_no_photo(
    running: Stack, http: httpx.AsyncClient
) -> None:
    user = User()
    catalog = (await http.get(f"{edge(running)}/v1/catalog", headers=user.headers)).json()
    taken = {m["modelId"]: m["inputImage"] for m in catalog["models"]}
    assert taken["stub-text"] == "INPUT_IMAGE_REFUSED"
    assert taken["stub-fast"] == "INPUT_IMAGE_REQUIRED"


async def test_a_text_to_image_job_succeeds_without_a_photo(
    running: Stack, http: httpx.AsyncClient
) -> None:
    user = User()
    submitted = await http.post(
        f"{edge(running)}/v1/jobs", headers=user.headers, json=body("stub-text")
    )
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["job"]
    assert job.get("inputAssetId", "") == ""
    done = await job_in(
        http, edge(running), user.headers, job["jobId"], {"JOB_STATUS_SUCCEEDED"}, within=30
    )
    picture = await picture_of(http, done)
    assert (picture.format, picture.size) == ("PNG", (384, 256))


async def test_a_job_from_an_input_url_succeeds(
    running: Stack, origin: Origin, http: httpx.AsyncClient
) -> None:
    user = User()
    url = origin.image("/kite.jpg", encode(scene(640, 480), "JPEG"), "image/jpeg")
    submitted = await http.post(
        f"{edge(running)}/v1/jobs",
        headers={**user.headers, "idempotency-key": "kite-1"},
        json=body("stub-fast", inputUrl=url),
    )
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["job"]
    # The photo media imported is the caller's own input asset.
    stored = await http.get(
        f"{edge(running)}/v1/assets/{job['inputAssetId']}", headers=user.headers
    )
    assert stored.status_code == 200, stored.text
    assert stored.json()["asset"]["purpose"] == "ASSET_PURPOSE_AI_INPUT"
    assert (stored.json()["asset"]["width"], stored.json()["asset"]["height"]) == (640, 480)
    done = await job_in(
        http, edge(running), user.headers, job["jobId"], {"JOB_STATUS_SUCCEEDED"}, within=30
    )
    assert (await picture_of(http, done)).size == (384, 256)
    # Another user cannot read that photo.
    other = await http.get(
        f"{edge(running)}/v1/assets/{job['inputAssetId']}", headers=User().headers
    )
    assert other.status_code == 404


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("https://169.254.169.254/latest/meta-data/", "ADDRESS_NOT_ALLOWED"),
        ("https://10.0.0.1/photo.png", "ADDRESS_NOT_ALLOWED"),
        ("http://example.com/photo.png", "URL_NOT_HTTPS"),
    ],
)
async def test_a_refused_url_is_400_naming_input_url(
    running: Stack, http: httpx.AsyncClient, url: str, cause: str
) -> None:
    user = User()
    response = await http.post(
        f"{edge(running)}/v1/jobs", headers=user.headers, json=body("stub-fast", inputUrl=url)
    )
    assert response.status_code == 400, response.text
    found = details(response)
    assert found["ErrorInfo"]["reason"] == "INPUT_URL_REFUSED"
    assert found["ErrorInfo"]["metadata"]["cause"] == cause
    assert [v["field"] for v in found["BadRequest"]["fieldViolations"]] == ["input_url"]
    listed = (await http.get(f"{edge(running)}/v1/jobs", headers=user.headers)).json()
    assert listed["jobs"] == []


async def test_a_missing_or_unwanted_photo_is_400_with_its_reason(
    running: Stack, origin: Origin, http: httpx.AsyncClient
) -> None:
    user = User()
    missing = await http.post(
        f"{edge(running)}/v1/jobs", headers=user.headers, json=body("stub-fast")
    )
    assert missing.status_code == 400, missing.text
    assert details(missing)["ErrorInfo"]["reason"] == "INPUT_IMAGE_REQUIRED"
    unwanted = await http.post(
        f"{edge(running)}/v1/jobs",
        headers=user.headers,
        json=body("stub-text", inputUrl=origin.url("/never.png")),
    )
    assert unwanted.status_code == 400, unwanted.text
    assert details(unwanted)["ErrorInfo"]["reason"] == "INPUT_IMAGE_REFUSED"
    assert [v["field"] for v in details(unwanted)["BadRequest"]["fieldViolations"]] == ["input_url"]


async def test_the_python_client_submits_without_a_photo_or_with_its_address(
    running: Stack, origin: Origin
) -> None:
    public = running.ports.public
    async with AsyncClient.connect(
        f"127.0.0.1:{public['creation']}",
        media=f"127.0.0.1:{public['media']}",
        notify=f"127.0.0.1:{public['notify']}",
        token=User().token,
    ) as atelier:
        text_only = await atelier.submit(
            model_id="stub-text", style_id="noir", prompt="a harbour", width=256, height=256
        )
        assert text_only.input_asset_id == ""
        url = origin.image("/client.png", encode(scene(300, 200)))
        by_url = await atelier.submit(
            model_id="stub-fast",
            style_id="watercolor",
            input_url=url,
            prompt="a harbour",
            width=256,
            height=256,
        )
        assert by_url.input_asset_id
        for job in (text_only, by_url):
            done = await atelier.wait_job(job.job_id, timeout=30)
            assert done.status == job_pb2.JOB_STATUS_SUCCEEDED, done
        with pytest.raises(InvalidArgument) as refused:
            await atelier.submit(
                model_id="stub-fast",
                style_id="watercolor",
                input_url="https://192.168.0.1/photo.png",
                width=256,
                height=256,
            )
        assert refused.value.reason == "INPUT_URL_REFUSED"
        assert refused.value.metadata["cause"] == "ADDRESS_NOT_ALLOWED"
        assert [v.field for v in refused.value.field_violations] == ["input_url"]

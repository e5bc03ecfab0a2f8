"""The web playground the edge serves at /, driven by a real headless Chromium (Debian's
/usr/bin/chromium through Playwright) against the whole stack: sign in (then only Sign
out is offered), upload a photo, a field error shown beside its field, a job watched live
to its picture on screen and downloaded, a 429 that goes once the limit passed, the
balance and history tiles (time, model, style), a second job cancelled (its bar ends as
cancelled), the job kept in the address across a reload, and the icon. A screenshot of
the finished page is kept at var/artifacts/playground.png."""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from PIL import Image
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect

from services.dev.stack import Stack
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from tests.acceptance.test_jobs_edge import User
from tests.support.https_origin import Origin, https_origin
from tests.support.pictures import encode, scene
from tests.support.stacks import stack_of_its_own

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts"
# ATELIER_WORKER_CONCURRENCY's default: the stack's one worker runs this many jobs at once.
WORKER_SLOTS = 8


@pytest.fixture(scope="module")
async def origin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Origin]:
    """A local HTTPS server whose photos the page names by address."""
    async with https_origin(tmp_path_factory.mktemp("origin")) as served:
        yield served


@pytest.fixture(scope="module")
def running(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory, origin: Origin
) -> Iterator[Stack]:
    """The whole stack with the job engine: the stub takes 3 s, beating progress twice a
    second, so the page sees a job running and has time to cancel another; one job in
    flight at a time, so a second submit meanwhile is refused (429). media may fetch from
    the local HTTPS server (a test setting)."""
    work = tmp_path_factory.mktemp("playground")
    engine = {
        "ATELIER_STUB_DURATION": "3",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        "ATELIER_HEARTBEAT": "0.5",
        "ATELIER_IN_FLIGHT_LIMIT": "1",
        "ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS": "127.0.0.1/32",
        "ATELIER_MEDIA_IMPORT_CA_FILE": str(origin.ca_file),
    }
    with stack_of_its_own(postgres_admin_url, work, "all", engine) as stack:
        yield stack


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    # Debian's Chromium (`make test` installs it); never a browser Playwright downloads.
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: run `make chromium` (as root)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            # Root (CI) cannot use Chromium's user-namespace sandbox.
            args=["--no-sandbox"],
        )
        yield launched
        await launched.close()


async def test_a_photo_becomes_a_picture_on_screen_and_a_second_job_is_cancelled(
    running: Stack, browser: Browser
) -> None:
    edge = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    page = await browser.new_page()
    # A CSP violation, a module that failed to load or an uncaught error shows up here.
    problems: list[str] = []
    page.on("console", lambda m: _keep_errors(m, problems))
    page.on("pageerror", lambda e: problems.append(str(e)))

    # The page itself: no token needed, HTML with a strict policy.
    response = await page.goto(f"{edge}/")
    assert response is not None and response.status == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in response.headers["content-security-policy"]
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")

    # The icon the page names, served by the edge itself.
    assert await page.locator("link[rel=icon]").get_attribute("href") == "/favicon.ico"
    icon = await page.request.get(f"{edge}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon"
    with Image.open(io.BytesIO(await icon.body())) as picture:
        assert picture.format == "ICO" and (32, 32) in picture.info["sizes"]

    # Signed out: only Sign in is offered.
    sign_in, sign_out = page.locator("#sign-in-button"), page.locator("#sign-out")
    await expect(sign_in).to_be_visible()
    await expect(sign_out).to_be_hidden()

    # Sign in with a development token: the welcome points and the catalog appear, and
    # only Sign out is offered.
    await page.fill("#token", user.token)
    await page.click("#token-form button[type=submit]")
    await expect(page.locator("#balance")).to_have_text("100 points")
    await expect(page.locator("#who")).to_contain_text(user.user_id)
    await expect(sign_out).to_be_visible()
    await expect(sign_in).to_be_hidden()
    await expect(page.locator("#token")).to_be_hidden()
    await page.select_option("#model", "stub-fast")
    await page.select_option("#style", "watercolor")

    # Upload a photo: CreateUpload, PUT to the signed URL, CompleteUpload.
    photo = encode(scene(160, 120), "JPEG")
    await page.set_input_files(
        "#photo", files=[{"name": "photo.jpg", "mimeType": "image/jpeg", "buffer": photo}]
    )
    await expect(page.locator("#upload-state")).to_have_text(re.compile("^Uploaded"))

    # A prompt the service refuses: its field violation is shown beside the prompt.
    await page.fill("#prompt", "a fox\x07")
    await page.click("#submit")
    await expect(page.locator("[data-error-for=prompt]")).to_contain_text("control characters")
    await expect(page.locator("#notice")).to_contain_text("correct the fields")

    # Submit: the job is watched live until its picture is on screen.
    await page.fill("#prompt", "a fox in the snow")
    await _record_statuses(page)
    await page.click("#submit")
    status = page.locator("#job-status")
    # A second submit while it is in flight: refused, said as a 429 while the limit holds.
    await expect(page.locator("#cancel")).to_be_enabled()
    await page.click("#submit")
    notice = page.locator("#notice")
    await expect(notice).to_contain_text("try again in")
    await expect(notice).to_have_class("limit")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "playground-limit.png"))
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED", timeout=20_000)
    # The job ended, so the limit passed: the notice goes (well before its 10 s retry).
    await expect(notice).to_be_hidden(timeout=5_000)
    await expect(page.locator("[data-error-for=prompt]")).to_be_empty()
    seen = await page.evaluate("window.__statuses")
    assert "JOB_STATUS_RUNNING" in seen, seen  # live states, not only the end
    assert await page.locator("#job-progress").evaluate("p => p.value") == 100
    await page.wait_for_function(
        "() => { const img = document.getElementById('result');"
        " return !img.hidden && img.complete && img.naturalWidth > 0; }"
    )
    first_job = (await page.locator("#job-id").text_content() or "").split()[1]
    await expect(page.locator("#balance")).to_have_text("95 points")
    tile = page.locator(f"#history button[data-job-id='{first_job}']")
    await expect(tile).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED")
    await tile.locator("img").evaluate(
        "img => img.complete && img.naturalWidth > 0"
        " || new Promise(ok => img.addEventListener('load', ok))"
    )
    # The tile says when, with which model and in which style (the catalog's names).
    await expect(tile.locator(".tile-model")).to_have_text("Quick Sketch")
    await expect(tile.locator(".tile-style")).to_have_text("Watercolor")
    await expect(tile.locator("time")).to_have_text(re.compile(r"^\d{1,2}:\d{2}"))
    made = await tile.locator("time").get_attribute("datetime")
    assert made is not None and abs(time.time() - _epoch(made)) < 300, made

    # The picture downloads: a file named after the job, the output's bytes.
    download_link = page.locator("#download")
    await expect(download_link).to_be_visible()
    async with page.expect_download() as started:
        await download_link.click()
    download = await started.value
    assert download.suggested_filename.startswith(f"atelier-{first_job}")
    saved = await download.path()
    with Image.open(saved) as picture:
        assert picture.width > 0 and picture.format in {"PNG", "JPEG", "WEBP"}
    await page.screenshot(path=str(ARTIFACTS / "playground-succeeded.png"), full_page=True)

    # A second job, cancelled while it runs: CANCELLED, its points released.
    await page.click("#submit")
    await expect(page.locator("#cancel")).to_be_enabled()
    second_job = (await page.locator("#job-id").text_content() or "").split()[1]
    assert second_job != first_job
    await page.click("#cancel")
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_CANCELLED", timeout=20_000)
    await expect(page.locator("#result")).to_be_hidden()
    await expect(download_link).to_be_hidden()
    # Its bar ended as cancelled, not frozen at its last progress.
    bar = page.locator("#job-progress")
    await expect(bar).to_have_attribute("data-state", "cancelled")
    await expect(bar).to_have_attribute("aria-valuetext", "cancelled")
    assert await bar.evaluate("p => p.value === p.max")
    await page.screenshot(path=str(ARTIFACTS / "playground-cancelled.png"), full_page=True)
    await expect(page.locator("#balance")).to_have_text("95 points")
    await expect(page.locator(f"#history button[data-job-id='{second_job}']")).to_have_attribute(
        "data-status", "JOB_STATUS_CANCELLED"
    )

    # Back to the first job from the history: its picture again, and the address names it.
    await tile.click()
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED")
    await expect(page.locator("#result")).to_be_visible()
    await expect(page).to_have_url(f"{edge}/#job={first_job}")

    # A reload keeps the job on screen (the tab keeps its token, the address the job).
    await page.reload()
    await expect(page.locator("#job-id")).to_contain_text(first_job)
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED")
    await expect(page.locator("#result")).to_be_visible()
    await expect(sign_out).to_be_visible()
    await expect(sign_in).to_be_hidden()

    await page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)

    # Signing out offers Sign in again and forgets the job.
    await sign_out.click()
    await expect(sign_in).to_be_visible()
    await expect(sign_out).to_be_hidden()
    await expect(page.locator("#job")).to_be_hidden()
    await expect(page).to_have_url(f"{edge}/")
    assert problems == []


async def test_a_text_model_needs_no_photo_and_a_photo_may_be_an_address(
    running: Stack, browser: Browser, origin: Origin
) -> None:
    edge = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    page = await browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: _keep_errors(m, problems))
    page.on("pageerror", lambda e: problems.append(str(e)))
    await page.goto(f"{edge}/")
    await page.fill("#token", user.token)
    await page.click("#token-form button[type=submit]")
    await expect(page.locator("#balance")).to_have_text("100 points")
    submit, status = page.locator("#submit"), page.locator("#job-status")

    # A model that restyles a photo: Generate waits for one.
    await page.select_option("#model", "stub-fast")
    await expect(page.locator("#model-photo")).to_contain_text("upload one")
    await expect(submit).to_be_disabled()

    # A text-to-image model: no photo, and the picture comes from the prompt alone.
    await page.select_option("#model", "stub-text")
    await expect(page.locator("#model-photo")).to_contain_text("no photo needed")
    await expect(submit).to_be_enabled()
    await page.fill("#prompt", "a lighthouse at dusk")
    await submit.click()
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED", timeout=20_000)
    await page.wait_for_function(
        "() => { const img = document.getElementById('result');"
        " return !img.hidden && img.complete && img.naturalWidth > 0; }"
    )
    first_job = (await page.locator("#job-id").text_content() or "").split()[1]

    # A photo by its address: refused addresses are said beside the field.
    await page.select_option("#model", "stub-fast")
    await page.fill("#photo-url", "https://169.254.169.254/latest/meta-data/")
    await expect(submit).to_be_enabled()
    await submit.click()
    await expect(page.locator("[data-error-for=input_url]")).to_contain_text("169.254.169.254")
    # An address media may fetch: the job runs from the photo it imported.
    url = origin.image("/playground.jpg", encode(scene(200, 150), "JPEG"), "image/jpeg")
    await page.fill("#photo-url", url)
    await submit.click()
    await expect(page.locator("#job-id")).not_to_contain_text(first_job)
    await expect(status).to_have_attribute("data-status", "JOB_STATUS_SUCCEEDED", timeout=20_000)
    assert origin.hits.count("/playground.jpg") == 1
    await expect(page.locator("[data-error-for=input_url]")).to_be_empty()
    await page.screenshot(path=str(ARTIFACTS / "playground-inputs.png"), full_page=True)
    assert problems == []


async def test_a_refused_token_is_explained(running: Stack, browser: Browser) -> None:
    an_hour_ago = time.time() - 3600
    expired = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "someone", 60, an_hour_ago)
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{running.ports.envoy}/#token={expired}")
    await expect(page.locator("#notice")).to_contain_text("TOKEN_EXPIRED")
    await expect(page.locator("#notice")).to_contain_text("paste a fresh one")
    # The token left the address bar at once (it was only ever in the fragment).
    assert "token" not in page.url


def _epoch(rfc3339: str) -> float:
    """Seconds since the epoch of a JSON timestamp ("2026-12-01T21:40:00.123456Z")."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _keep_errors(message: ConsoleMessage, problems: list[str]) -> None:
    # Chromium logs every non-2xx answer too: the refused prompt's 400 is expected.
    if message.type == "error" and not message.text.startswith("Failed to load resource"):
        problems.append(message.text)


async def _record_statuses(page: Page) -> None:
    """Every status the job card shows from now on, in window.__statuses."""
    await page.evaluate(
        """() => {
          window.__statuses = [];
          const status = document.getElementById('job-status');
          new MutationObserver(() => window.__statuses.push(status.dataset.status))
            .observe(status, {attributes: true, attributeFilter: ['data-status']});
        }"""
    )


async def test_stream_lines_split_anywhere_and_errors_read_as_sentences(
    running: Stack, browser: Browser
) -> None:
    """The page's own modules, in the browser: a watch stream's JSON lines parsed as
    they complete whatever the chunking, and answers turned into what a user reads."""
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{running.ports.envoy}/")
    found = await page.evaluate(
        """async () => {
          const edge = await import('/playground/edge.js');
          const chunks = ['{"job":{"version":"1"}}\\n{"keep', 'Alive":{}}', '\\n\\n{"job":',
                          '{"version":"2","done":true}}\\n'];
          const encoder = new TextEncoder();
          const body = new ReadableStream({start(c) {
            for (const chunk of chunks) c.enqueue(encoder.encode(chunk));
            c.close();
          }});
          const messages = [];
          for await (const m of edge.jsonLines(new Response(body))) messages.push(m);
          const info = (name, fields) => ({'@type': `type.googleapis.com/google.rpc.${name}`,
                                           ...fields});
          const retry = info('RetryInfo', {retryDelay: '2.5s'});
          const quota = new edge.EdgeError(429, {code: 8, message: 'quota', details: [retry]});
          const limited = new edge.EdgeError(429, {code: 8, message: 'slow down'}, '7');
          const down = new edge.EdgeError(503, {code: 14, message: 'media is down'}, '1');
          const width = {field: 'width', description: 'must be a multiple of 64'};
          const violation = info('BadRequest', {fieldViolations: [width]});
          const bad = new edge.EdgeError(400, {code: 3, message: 'bad', details: [violation]});
          // UNAVAILABLE is retried after retry-after, telling the page; 429 is not.
          const status = (code, http, after) => new Response(JSON.stringify({code}),
            {status: http, headers: {'retry-after': after}});
          const answers = [status(14, 503, '0'), new Response('{"ok":true}'), status(8, 429, '4')];
          const realFetch = window.fetch;
          window.fetch = async () => answers.shift();
          const busy = [];
          const retried = await edge.callJson('/v1/balance', {onBusy: (e) => busy.push(e.code)});
          const refused = await edge.callJson('/v1/balance', {onBusy: (e) => busy.push(e.code)})
            .catch((e) => e.describe());
          window.fetch = realFetch;
          return {messages, retried, refused, busy,
                  quota: quota.describe(), limited: limited.describe(),
                  down: down.describe(), fields: bad.fieldViolations, id: edge.newRequestId()};
        }"""
    )
    assert found["messages"] == [
        {"job": {"version": "1"}},
        {"keepAlive": {}},
        {"job": {"version": "2", "done": True}},
    ]
    assert found["retried"] == {"ok": True} and found["busy"] == [14]
    assert "try again in 4 s" in found["refused"]
    assert "try again in 3 s" in found["quota"]
    assert "try again in 7 s" in found["limited"]
    assert found["down"] == "The service is busy: try again in 1 s."
    assert found["fields"] == [{"field": "width", "description": "must be a multiple of 64"}]
    uuid4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert re.fullmatch(uuid4, found["id"])


async def test_a_models_settings_are_fields_and_a_queued_job_says_where_it_stands(
    running: Stack, browser: Browser
) -> None:
    """The chosen model's parameter specs become fields (empty: the model's default); a
    value the service refuses is said beside its field, one it takes reaches the job. With
    the workers busy, a queued job says how many jobs are ahead of it, then runs."""
    edge = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    page = await browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: _keep_errors(m, problems))
    page.on("pageerror", lambda e: problems.append(str(e)))
    await page.goto(f"{edge}/")
    await page.fill("#token", user.token)
    await page.click("#token-form button[type=submit]")
    await expect(page.locator("#balance")).to_have_text("100 points")
    await page.select_option("#model", "stub-text")
    seed = page.locator("#parameter-seed")
    await expect(page.locator("#parameters")).to_be_visible()
    await expect(seed).to_have_attribute("placeholder", "model's choice")

    # Out of the spec's range: the service's field violation, beside the field.
    await page.fill("#prompt", "a lighthouse at dusk")
    await seed.fill("-1")
    await page.click("#submit")
    await expect(page.locator("[data-error-for='parameters.seed']")).not_to_be_empty()

    # The workers' eight slots taken by other users' jobs (3 s each), so this one queues.
    await seed.fill("42")
    async with httpx.AsyncClient(base_url=edge, timeout=15) as http:
        for _ in range(WORKER_SLOTS + 4):
            other = User()
            answer = await http.post(
                "/v1/jobs",
                headers={**other.headers, "content-type": "application/json"},
                json={
                    "modelId": "stub-text",
                    "styleId": "watercolor",
                    "prompt": "busy",
                    "width": 512,
                    "height": 512,
                },
            )
            assert answer.status_code == 200, answer.text
        await page.click("#submit")
        queue = page.locator("#job-queue")
        await expect(queue).to_contain_text("ahead")
        assert int(await queue.get_attribute("data-position") or "0") > 0
        await page.screenshot(path=str(ARTIFACTS / "playground-queued.png"), full_page=True)
        status = page.locator("#job-status")
        await expect(status).to_have_attribute(
            "data-status", "JOB_STATUS_SUCCEEDED", timeout=30_000
        )
        await expect(queue).to_be_hidden()
        job_id = (await page.locator("#job-id").text_content() or "").split()[1]
        job = (await http.get(f"/v1/jobs/{job_id}", headers=user.headers)).json()["job"]
    assert job["parameters"] == {"seed": {"intValue": "42"}}
    await expect(page.locator("[data-error-for='parameters.seed']")).to_be_empty()
    assert problems == []

"""The operator's console (services/console, web/console/) driven by a real headless
Chromium (Debian's, through Playwright, as the playground's test) against the whole stack:
a worker SIGKILLed after the stub accepted a job's submit leaves it NEEDS_ATTENTION; an
operator signs in, opens the attention queue, inspects the job (the stub's request found
by the job id), adopts it with a reason, and sees it succeed — one submit in all, the
decision recorded with the operator's identity. Refused: no credential, a user's token,
a service of another role, the shared service credential; the public edge serves neither
the console nor its API. The failed pushes view (notify's NotifyAdminService) shows why
APNs refused a push, the token only by its last characters; a redelivery without a
reason is refused. Screenshots at 1280 px and 390 px are kept in the test's temporary
folder (console-1280.png, console-390.png, console-pushes-1280.png, console-pushes-390.png);
no console errors."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.acceptance.test_jobs_edge import User
from tests.support.apns_peer import alert, insert_token
from tests.support.crash_matrix import submit
from tests.support.stacks import job_in, stack_of_its_own
from tests.support.workers import WorkerProcess, exited, serving, start_worker

CHROMIUM = Path("/usr/bin/chromium")
ENGINE_ENV = {
    "ATELIER_STUB_DURATION": "1",
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_WORKER_POLL": "0.5",
    # A person decides: the reaper must not adopt on its own here.
    "ATELIER_AUTO_ADOPT": "none",
}


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack with the API alone (the test starts its workers), the console beside it."""
    work = tmp_path_factory.mktemp("console")
    with stack_of_its_own(
        postgres_admin_url, work, "api", {"ATELIER_ENV": "test"}, console=True
    ) as stack:
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


def _keep_errors(message: ConsoleMessage, problems: list[str]) -> None:
    # Chromium logs every non-2xx answer too: the refused sign-ins' 401 and 403 are expected.
    if message.type == "error" and not message.text.startswith("Failed to load resource"):
        problems.append(message.text)


async def lost_submit(
    api: Stack, http: httpx.AsyncClient, ledger: Path
) -> tuple[str, dict[str, str], WorkerProcess]:
    """A job whose worker died after the stub accepted it, now NEEDS_ATTENTION, and the
    survivor worker (recovery off) that will poll it once adopted."""
    user, job_id = await submit(api, http)
    env = {**ENGINE_ENV, "ATELIER_STUB_LEDGER": str(ledger)}
    doomed = start_worker(api, "console-doomed", {**env, "ATELIER_STUB_CRASH_AT": "after_submit"})
    assert await exited(doomed, within=30) == -9
    survivor = start_worker(api, "console-survivor", env)
    await serving(survivor)
    edge = f"http://127.0.0.1:{api.ports.envoy}"
    waiting = await job_in(
        http, edge, user.headers, job_id, {"JOB_STATUS_NEEDS_ATTENTION"}, within=40
    )
    assert waiting["status"] == "JOB_STATUS_NEEDS_ATTENTION"
    return job_id, user.headers, survivor


async def sign_in(page: Page, credential: str) -> None:
    await page.fill("#credential", credential)
    await page.click("#sign-in button[type=submit]")


async def test_an_operator_adopts_a_lost_submit_in_the_console(
    api: Stack, browser: Browser, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    job_id, owner, survivor = await lost_submit(api, http, ledger)
    console = f"http://127.0.0.1:{api.ports.console}"
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: _keep_errors(m, problems))
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        response = await page.goto(f"{console}/")
        assert response is not None and response.status == 200
        assert "script-src 'self'" in response.headers["content-security-policy"]
        await expect(page.locator("body")).to_have_attribute("data-ready", "true")

        # Sign in: the operator's own identity is named; the queue's figures show.
        await sign_in(page, api.credentials.operator)
        await expect(page.locator("#who")).to_have_text("Signed in as dev-operator")
        await expect(page.locator("#needs-attention")).to_have_text("1")

        # The attention queue, by keyboard: the arrow key moves to its tab.
        await page.focus("#tab-overview")
        await page.keyboard.press("ArrowRight")
        await expect(page.locator("#tab-attention")).to_have_attribute("aria-selected", "true")
        await expect(page.locator("#attention-jobs tbody tr")).to_have_count(1)
        await page.get_by_role("button", name=f"Inspect job {job_id}").click()

        # InspectJob: the stub's request, found by the job id, and the timeline.
        requests = page.locator("#provider-requests tbody tr")
        await expect(requests).to_have_count(1)
        (request_id,) = read_ledger(ledger)[job_id]
        await expect(requests.first).to_contain_text(request_id)
        await expect(requests.first).to_contain_text("found")
        await expect(page.locator("#timeline li").last).to_contain_text("needs attention")
        await page.screenshot(path=str(tmp_path / "console-inspect-1280.png"), full_page=True)

        # Retry warns that it may pay twice; a reason is required.
        await page.select_option("#resolution", "RESOLUTION_RETRY")
        await expect(page.locator("#retry-warning")).to_be_visible()
        assert await page.locator("#reason").get_attribute("required") is not None

        # Adopt: the request id comes from the row; the job succeeds on screen.
        await page.get_by_role("button", name=f"Adopt request {request_id}").click()
        await expect(page.locator("#request-id")).to_have_value(request_id)
        await expect(page.locator("#retry-warning")).to_be_hidden()
        await page.fill("#reason", "INC-7: the stub holds the request")
        await page.click("#resolve-form button[type=submit]")
        await expect(page.locator("#inspect-status")).to_have_text("succeeded", timeout=60_000)
        await expect(page.locator("#timeline")).to_contain_text(
            f"operator dev-operator · adopted provider request {request_id}: INC-7"
        )
        await page.screenshot(path=str(tmp_path / "console-1280.png"), full_page=True)

        # The same page at a phone's width: it fits (no sideways scroll of the page).
        await page.set_viewport_size({"width": 390, "height": 844})
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width
        await page.screenshot(path=str(tmp_path / "console-390.png"), full_page=True)
    finally:
        assert survivor.stop() == 0
    assert problems == []
    assert len(read_ledger(ledger)[job_id]) == 1  # one provider submit in all
    edge = f"http://127.0.0.1:{api.ports.envoy}"
    balance = (await http.get(f"{edge}/v1/balance", headers=owner)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (90, 0)
    for name in ("console-1280.png", "console-390.png"):
        assert (tmp_path / name).stat().st_size > 10_000


async def test_the_console_refuses_everyone_but_operators(
    api: Stack, browser: Browser, http: httpx.AsyncClient
) -> None:
    console = f"http://127.0.0.1:{api.ports.console}"
    # No credential at all, a user's token, a service of another role (the app backend),
    # the shared service credential (it names nobody): each refused, nothing else called.
    for headers, status, reason in (
        ({}, 401, "MISSING_CREDENTIALS"),
        ({"authorization": f"Bearer {User().token}"}, 401, None),
        ({"authorization": f"Bearer {api.credentials.backend}"}, 403, "RPC_NOT_PERMITTED"),
        ({"authorization": f"Bearer {api.credentials.creation}"}, 403, "RPC_NOT_PERMITTED"),
        ({"authorization": f"Bearer {DEV_SERVICE_TOKEN}"}, 403, "OPERATOR_REQUIRED"),
    ):
        answer = await http.post(f"{console}/api/ListAttentionJobs", headers=headers, json={})
        assert answer.status_code == status, (headers, answer.text)
        if reason is not None:
            reasons = [d.get("reason") for d in answer.json()["details"]]
            assert reason in reasons, answer.json()
    operator = {"authorization": f"Bearer {api.credentials.operator}"}
    assert (await http.post(f"{console}/api/NoSuchMethod", headers=operator)).status_code == 404
    bad = await http.post(f"{console}/api/InspectJob", headers=operator, content=b"{nope")
    assert bad.status_code == 400
    invalid = await http.post(f"{console}/api/InspectJob", headers=operator, json={"jobId": "x"})
    assert invalid.status_code == 400
    assert "INVALID_ADMIN_REQUEST" in invalid.text

    # The page says so when a user's token is tried, and stays signed out.
    page = await browser.new_page()
    await page.goto(f"{console}/")
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await sign_in(page, User().token)
    await expect(page.locator("#sign-in-error")).to_contain_text("Not signed in")
    await expect(page.locator("#tabs")).to_be_hidden()
    await page.close()

    # The public edge serves neither the console nor its API, nor AdminService.
    edge = f"http://127.0.0.1:{api.ports.envoy}"
    for path in ("/console/app.js", "/console/style.css"):
        assert (await http.get(f"{edge}{path}")).status_code == 404, path
    for path in ("/api/InspectJob", "/atelier.creation.v1.AdminService/InspectJob"):
        answer = await http.post(f"{edge}{path}", headers=operator, json={})
        assert answer.status_code == 404, (path, answer.text)
    assert "atelier console" not in (await http.get(f"{edge}/")).text


async def failed_pushes(api: Stack) -> list[str]:
    """Two pushes the sender gave up on, as its outcomes leave them in notify's tables:
    APNs refused one (BadCollapseId) and one token (BadDeviceToken). Their tokens."""
    engine = create_async_engine(asyncpg_url(api.database_url))
    tokens = []
    try:
        for status, reason in (("failed", "BadCollapseId"), ("dropped", "BadDeviceToken")):
            token_id, token = await insert_token(engine, environment="production")
            headers, payload = alert()
            async with engine.begin() as connection:
                # Written as the sender leaves them (never pending: no sender claims them).
                push_id = await connection.scalar(
                    text(
                        "INSERT INTO notify.pushes (token_id, job_id, version, kind, priority,"
                        " headers, payload, status, attempts, next_attempt_at, apns_id,"
                        " last_http_status, last_reason, created_at) VALUES (:token_id,"
                        " :job_id, 3, 'alert', 10, CAST(:headers AS jsonb),"
                        " CAST(:payload AS jsonb), :status, 1, now(), :apns, 400, :reason,"
                        " now()) RETURNING push_id"
                    ),
                    {
                        "token_id": token_id,
                        "job_id": uuid.uuid4(),
                        "headers": json.dumps(headers),
                        "payload": json.dumps(payload),
                        "status": status,
                        "apns": f"apns-{status}",
                        "reason": reason,
                    },
                )
                await connection.execute(
                    text(
                        "INSERT INTO notify.push_attempts (push_id, attempt, apns_id,"
                        " http_status, reason, at) VALUES (:id, 1, :apns, 400, :reason, now())"
                    ),
                    {"id": push_id, "apns": f"apns-{status}", "reason": reason},
                )
            tokens.append(token)
    finally:
        await engine.dispose()
    return tokens


async def test_an_operator_sees_failed_pushes_in_the_console(
    api: Stack, browser: Browser, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    tokens = await failed_pushes(api)
    console = f"http://127.0.0.1:{api.ports.console}"
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: _keep_errors(m, problems))
    page.on("pageerror", lambda e: problems.append(str(e)))
    await page.goto(f"{console}/")
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await sign_in(page, api.credentials.operator)
    await expect(page.locator("#who")).to_have_text("Signed in as dev-operator")

    await page.get_by_role("tab", name="Failed pushes").click()
    rows = page.locator("#failed-pushes tbody tr")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#failed-pushes")).to_contain_text("400 BadCollapseId")
    await expect(page.locator("#failed-pushes")).to_contain_text("400 BadDeviceToken")
    await expect(page.locator("#failed-pushes")).to_contain_text("token refused")
    for token in tokens:
        await expect(page.locator("#failed-pushes")).to_contain_text(f"…{token[-6:]}")
        assert token not in await page.content()
    await page.screenshot(path=str(tmp_path / "console-pushes-1280.png"), full_page=True)
    # A time filter after both: none listed.
    await page.fill("#pushes-since", "2999-01-01T00:00")
    await page.click("#pushes-form button[type=submit]")
    await expect(page.locator("#pushes-empty")).to_be_visible()
    await page.fill("#pushes-since", "")
    await page.click("#pushes-form button[type=submit]")
    await expect(rows).to_have_count(2)

    await page.set_viewport_size({"width": 390, "height": 844})
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    await page.screenshot(path=str(tmp_path / "console-pushes-390.png"), full_page=True)
    await page.close()
    assert problems == []
    for name in ("console-pushes-1280.png", "console-pushes-390.png"):
        assert (tmp_path / name).stat().st_size > 10_000

    # The same list through the console's API, and its refusals: no credential, a
    # service of another role (notify's own policy answers); a redelivery needs a reason.
    operator = {"authorization": f"Bearer {api.credentials.operator}"}
    listed = await http.post(f"{console}/api/ListFailedPushes", headers=operator, json={})
    assert listed.status_code == 200, listed.text
    assert {p["reason"] for p in listed.json()["pushes"]} == {"BadCollapseId", "BadDeviceToken"}
    assert (await http.post(f"{console}/api/ListFailedPushes", json={})).status_code == 401
    backend = {"authorization": f"Bearer {api.credentials.backend}"}
    refused = await http.post(f"{console}/api/ListFailedPushes", headers=backend, json={})
    assert refused.status_code == 403, refused.text
    unexplained = await http.post(
        f"{console}/api/RedeliverWebhooks", headers=operator, json={"deliveryId": "1"}
    )
    assert unexplained.status_code == 400, unexplained.text
    body = unexplained.json()
    assert "INVALID_ADMIN_REQUEST" in [d.get("reason") for d in body["details"]]
    violations = [v["field"] for d in body["details"] for v in d.get("fieldViolations", [])]
    assert violations == ["reason"]

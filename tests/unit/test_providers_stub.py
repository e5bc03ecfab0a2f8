"""The stub provider as the worker sees it: two-phase, progress over a duration with an
injected clock, real outputs, resumable from another instance or process, injected
faults with the failure table's flags, the ledger, and crash points that really kill."""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops, ImageStat

from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    InputImage,
    ProviderError,
    Running,
)
from services.creation.providers.stub import (
    StubProvider,
    crash_point,
    provider,
    read_ledger,
    styles,
)
from services.creation.settings import CreationSettings, StubFault, StubSettings
from tests.support.pictures import encode, scene

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def request(job_id: str = "job-1", style: str = "anime", outputs: int = 1) -> GenerationRequest:
    return GenerationRequest(
        job_id=job_id,
        attempt=1,
        provider_model="stub-fast-v1",
        style_id=style,
        prompt="a lighthouse",
        negative_prompt="",
        width=96,
        height=64,
        input_image=InputImage(encode(scene(), "JPEG"), "image/jpeg"),
        num_outputs=outputs,
    )


async def test_the_outputs_are_the_size_the_request_asks(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0), Clock())
    asked = replace(request(outputs=2), width=512, height=512)
    asked = replace(asked, input_image=InputImage(encode(scene(800, 600), "JPEG"), "image/jpeg"))
    done = await stub.poll(await stub.submit(asked, "k"))
    assert isinstance(done, Done)
    assert [Image.open(io.BytesIO(o.data)).size for o in done.outputs] == [(512, 512)] * 2
    assert [(o.width, o.height) for o in done.outputs] == [(512, 512)] * 2


async def test_a_request_without_a_photo_paints_its_prompt(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0), Clock())
    text_only = replace(request(outputs=2), input_image=None, width=320, height=200)
    done = await stub.poll(await stub.submit(text_only, "k"))
    assert isinstance(done, Done)
    assert [(o.content_type, o.width, o.height) for o in done.outputs] == [
        ("image/png", 320, 200)
    ] * 2
    # Another instance (a resumed worker) paints the same bytes from the stored prompt;
    # another prompt paints another picture.
    again = await StubProvider(settings(tmp_path, duration_seconds=0), Clock()).poll(
        await stub.submit(text_only, "k2")
    )
    assert isinstance(again, Done) and again.outputs[0].data == done.outputs[0].data
    other = await stub.poll(await stub.submit(replace(text_only, prompt="a harbour"), "k3"))
    assert isinstance(other, Done) and other.outputs[0].data != done.outputs[0].data


def settings(tmp_path: Path, **changes: object) -> StubSettings:
    base = StubSettings(
        duration_seconds=10,
        state_dir=str(tmp_path / "state"),
        ledger_path=str(tmp_path / "ledger"),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_from_settings_reads_the_creation_settings(tmp_path: Path) -> None:
    stub = StubProvider.from_settings(CreationSettings.from_env({}))
    assert (stub.code, stub.version, stub.supports_idempotent_submit) == ("stub", "stub-1", False)


async def test_progress_rises_over_the_duration_then_the_outputs_come(tmp_path: Path) -> None:
    clock = Clock()
    stub = StubProvider(settings(tmp_path), clock)
    request_id = await stub.submit(request(outputs=3), "job-1:1")
    seen = []
    for _ in range(10):
        answer = await stub.poll(request_id)
        assert isinstance(answer, Running)
        seen.append(answer.progress)
        clock.now += 1
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 90
    done = await stub.poll(request_id)
    assert isinstance(done, Done) and len(done.outputs) == 3
    assert all((o.content_type, o.width, o.height) == ("image/jpeg", 96, 64) for o in done.outputs)
    # Visibly different: each pair of outputs differs by a clear mean pixel difference.
    pictures = [Image.open(io.BytesIO(o.data)).convert("L") for o in done.outputs]
    for one, other in itertools.combinations(pictures, 2):
        mean = ImageStat.Stat(ImageChops.difference(one, other)).mean[0]
        assert mean > 8, mean
    # The same request gives the same bytes again (a resumed worker lands the same assets).
    again = await stub.poll(request_id)
    assert isinstance(again, Done)
    assert [o.data for o in again.outputs] == [o.data for o in done.outputs]


async def test_a_zero_duration_is_done_on_the_first_poll(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0), Clock())
    done = await stub.poll(await stub.submit(request(), "k"))
    assert isinstance(done, Done) and len(done.outputs) == 1


async def test_another_instance_resumes_a_request_it_never_saw(tmp_path: Path) -> None:
    clock = Clock()
    first = StubProvider(settings(tmp_path), clock)
    request_id = await first.submit(request(outputs=2), "job-1:1")
    clock.now += 4
    second = StubProvider(settings(tmp_path), clock)  # as after a worker crash
    assert await second.poll(request_id) == Running(40)
    clock.now += 6
    resumed, original = await second.poll(request_id), await first.poll(request_id)
    assert isinstance(resumed, Done) and resumed == original


async def test_another_process_resumes_a_request_and_the_ledger_has_both(tmp_path: Path) -> None:
    clock = Clock()
    stub = StubProvider(settings(tmp_path, duration_seconds=0), clock)
    mine = await stub.submit(request("job-here"), "k")
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from services.creation.providers.stub import StubProvider\n"
        "from services.creation.settings import StubSettings\n"
        "from tests.unit.test_providers_stub import request\n"
        f"s = StubSettings(duration_seconds=0, state_dir={str(tmp_path / 'state')!r},"
        f" ledger_path={str(tmp_path / 'ledger')!r})\n"
        "print(asyncio.run(StubProvider(s).submit(request('job-there'), 'k')))\n"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    assert child.returncode == 0
    theirs = out.decode().strip()
    assert isinstance(await stub.poll(theirs), Done)
    assert read_ledger(tmp_path / "ledger") == {"job-here": [mine], "job-there": [theirs]}


@pytest.mark.parametrize("request_id", ["0" * 32, "../../etc/passwd", ""])
async def test_an_unknown_request_is_a_retryable_request_unknown(
    tmp_path: Path, request_id: str
) -> None:
    answer = await StubProvider(settings(tmp_path), Clock()).poll(request_id)
    assert isinstance(answer, Failed)
    assert (answer.code, answer.retryable) == ("REQUEST_UNKNOWN", True)


async def test_a_request_from_a_stub_without_the_state_is_unknown(tmp_path: Path) -> None:
    here = StubProvider(settings(tmp_path / "a"), Clock())
    elsewhere = StubProvider(settings(tmp_path / "b"), Clock())
    answer = await elsewhere.poll(await here.submit(request(), "k"))
    assert isinstance(answer, Failed) and answer.code == "REQUEST_UNKNOWN"


async def test_a_cancelled_request_answers_cancelled(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path), Clock())
    request_id = await stub.submit(request(), "k")
    await stub.cancel(request_id)
    await stub.cancel(request_id)  # harmless twice
    await stub.cancel("f" * 32)  # and for a request it never had
    answer = await StubProvider(settings(tmp_path), Clock()).poll(request_id)
    assert answer == Failed("CANCELLED", "the request was cancelled", retryable=False)


async def test_an_unreadable_input_fails_for_good(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0), Clock())
    broken = replace(request(), input_image=InputImage(b"not an image", "image/jpeg"))
    answer = await stub.poll(await stub.submit(broken, "k"))
    assert isinstance(answer, Failed)
    assert (answer.code, answer.retryable) == ("INPUT_UNREADABLE", False)


async def test_an_input_over_the_pixel_limit_fails_for_good(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0, max_input_pixels=5000), Clock())
    answer = await stub.poll(await stub.submit(request(), "k"))
    assert isinstance(answer, Failed) and answer.code == "INPUT_UNREADABLE"
    assert "96x64 pixels; at most 5000" in answer.message


def faulty(tmp_path: Path, call: str, code: str, times: int) -> StubProvider:
    faults = (StubFault(call, code, times),)
    return StubProvider(settings(tmp_path, duration_seconds=0, faults=faults), Clock())


async def test_a_submit_fails_n_times_then_succeeds_and_only_that_one_reached(
    tmp_path: Path,
) -> None:
    stub = faulty(tmp_path, "submit", "UNAVAILABLE", 2)
    for _ in range(2):
        with pytest.raises(ProviderError) as raised:
            await stub.submit(request(), "k")
        assert raised.value.code == "UNAVAILABLE"
        assert raised.value.retryable and not raised.value.outcome_unknown
    request_id = await stub.submit(request(), "k")
    assert read_ledger(tmp_path / "ledger") == {"job-1": [request_id]}


async def test_a_terminal_code_on_submit_is_not_retryable(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as raised:
        await faulty(tmp_path, "submit", "CONTENT_REJECTED", 1).submit(request(), "k")
    assert raised.value.code == "CONTENT_REJECTED" and not raised.value.retryable


async def test_a_submit_timeout_was_accepted_and_its_outcome_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as raised:
        await faulty(tmp_path, "submit", "TIMEOUT", 1).submit(request(), "k")
    assert raised.value.outcome_unknown and raised.value.retryable
    # The provider did take it: a second submit would run the model twice.
    assert len(read_ledger(tmp_path / "ledger")["job-1"]) == 1


async def test_rate_limited_says_when_to_come_back(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as raised:
        await faulty(tmp_path, "submit", "RATE_LIMITED", 1).submit(request(), "k")
    assert raised.value.retry_after_seconds == 1.0


async def test_a_generation_failure_on_poll_is_answered_then_the_truth(tmp_path: Path) -> None:
    stub = faulty(tmp_path, "poll", "CONTENT_REJECTED", 1)
    request_id = await stub.submit(request(), "k")
    answer = await stub.poll(request_id)
    assert isinstance(answer, Failed)
    assert (answer.code, answer.retryable) == ("CONTENT_REJECTED", False)
    assert isinstance(await stub.poll(request_id), Done)


async def test_a_transient_generation_failure_on_poll_is_retryable(tmp_path: Path) -> None:
    stub = faulty(tmp_path, "poll", "TRANSIENT", 1)
    answer = await stub.poll(await stub.submit(request(), "k"))
    assert isinstance(answer, Failed) and answer.retryable


async def test_a_call_failure_on_poll_is_raised(tmp_path: Path) -> None:
    stub = faulty(tmp_path, "poll", "UNAVAILABLE", 1)
    request_id = await stub.submit(request(), "k")
    with pytest.raises(ProviderError) as raised:
        await stub.poll(request_id)
    assert raised.value.retryable
    assert isinstance(await stub.poll(request_id), Done)


async def test_zero_times_fails_every_time(tmp_path: Path) -> None:
    stub = faulty(tmp_path, "cancel", "INTERNAL", 0)
    for _ in range(5):
        with pytest.raises(ProviderError, match="INTERNAL"):
            await stub.cancel("f" * 32)


async def test_latency_is_added_to_each_call(tmp_path: Path) -> None:
    stub = StubProvider(settings(tmp_path, duration_seconds=0, latency_seconds=0.2), Clock())
    started = time.monotonic()
    await stub.poll(await stub.submit(request(), "k"))
    assert time.monotonic() - started >= 0.4


async def test_rendering_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = []

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return styles.render(*args)

    monkeypatch.setattr(provider, "render", spy)
    stub = StubProvider(settings(tmp_path, duration_seconds=0), Clock())
    assert isinstance(await stub.poll(await stub.submit(request(), "k")), Done)
    assert threads and threads[0] is not threading.main_thread()


def run_crashing(crash_at: str, code: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "ATELIER_STUB_CRASH_AT": crash_at}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def test_crash_point_kills_the_process_with_sigkill_at_the_named_point() -> None:
    code = (
        "from services.creation.providers.stub import crash_point\n"
        "crash_point('after_output'); print('passed after_output', flush=True)\n"
        "crash_point('before_complete'); print('passed before_complete', flush=True)\n"
    )
    died = run_crashing("before_complete", code)
    assert died.returncode == -signal.SIGKILL
    assert died.stdout.split("\n")[:-1] == ["passed after_output"]


def test_an_unknown_crash_point_name_is_a_bug() -> None:
    with pytest.raises(ValueError, match="unknown crash point 'midway'"):
        crash_point("midway", "")


def test_the_stub_dies_after_the_provider_accepted_and_before_returning_the_id(
    tmp_path: Path,
) -> None:
    code = (
        "import asyncio\n"
        "from services.creation.providers.stub import StubProvider\n"
        "from services.creation.settings import CreationSettings\n"
        "from tests.unit.test_providers_stub import request\n"
        "stub = StubProvider.from_settings(CreationSettings.from_env())\n"
        "print('got', asyncio.run(stub.submit(request(), 'k')), flush=True)\n"
    )
    environ_extra = {
        "ATELIER_STUB_STATE_DIR": str(tmp_path / "state"),
        "ATELIER_STUB_LEDGER": str(tmp_path / "ledger"),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environ_extra.items():
            patch.setenv(name, value)
        died = run_crashing("after_submit", code)
        before = run_crashing("before_submit", code)
    assert died.returncode == before.returncode == -signal.SIGKILL
    assert "got" not in died.stdout
    # after_submit: accepted once and stored, so a resumed poll could find it.
    (accepted,) = read_ledger(tmp_path / "ledger")["job-1"]
    assert (tmp_path / "state" / f"{accepted}.req").exists()


@pytest.mark.parametrize("outputs", [0, 5])
async def test_a_request_for_too_few_or_too_many_outputs_is_invalid(
    tmp_path: Path, outputs: int
) -> None:
    with pytest.raises(ProviderError) as raised:
        await StubProvider(settings(tmp_path), Clock()).submit(request(outputs=outputs), "k")
    assert raised.value.code == "INVALID_INPUT" and not raised.value.retryable
    assert read_ledger(tmp_path / "ledger") == {}


async def test_a_state_directory_it_cannot_use_makes_the_stub_unavailable(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    stub = StubProvider(settings(tmp_path, state_dir=str(blocked)), Clock())
    for call in (stub.submit(request(), "k"), stub.poll("a" * 32), stub.cancel("a" * 32)):
        with pytest.raises(ProviderError) as raised:
            await call
        assert raised.value.code == "UNAVAILABLE" and raised.value.retryable
        assert not raised.value.outcome_unknown
    # Nothing was accepted, so nothing reached the ledger.
    assert read_ledger(tmp_path / "ledger") == {}


JOB_A = "0b7e2f7e-8d57-4c51-9d3e-3a4c7c1b2a01"
JOB_B = "0b7e2f7e-8d57-4c51-9d3e-3a4c7c1b2a02"


async def test_the_stub_finds_a_jobs_requests_by_our_reference(tmp_path: Path) -> None:
    clock = Clock()
    stub = StubProvider(settings(tmp_path, duration_seconds=10), clock)
    first = await stub.submit(request(job_id=JOB_A), f"{JOB_A}:1")
    clock.now += 1
    second = await stub.submit(replace(request(job_id=JOB_A), attempt=2), f"{JOB_A}:2")
    other = await stub.submit(request(job_id=JOB_B), f"{JOB_B}:1")
    # Another instance over the same directory (another process) finds the same.
    found = await StubProvider(settings(tmp_path, duration_seconds=10), clock).find_requests(JOB_A)
    assert [(r.request_id, r.job_id, r.attempt) for r in found] == [
        (first, JOB_A, 1),
        (second, JOB_A, 2),
    ]
    assert [r.state.value for r in found] == ["running", "running"]
    assert found[0].progress == 10 and found[1].progress == 0
    assert [r.request_id for r in await stub.find_requests(JOB_B)] == [other]
    assert await stub.find_requests("not-a-job-id/../..") == []


async def test_the_stub_describes_a_request_without_rendering_it(tmp_path: Path) -> None:
    clock = Clock()
    stub = StubProvider(settings(tmp_path, duration_seconds=1), clock)
    request_id = await stub.submit(request(job_id=JOB_A), f"{JOB_A}:1")
    clock.now += 5
    described = await stub.describe(request_id)
    assert described is not None
    assert (described.job_id, described.state.value, described.progress) == (
        JOB_A,
        "succeeded",
        100,
    )
    await stub.cancel(request_id)
    cancelled = await stub.describe(request_id)
    assert cancelled is not None and cancelled.state.value == "cancelled"
    assert await stub.describe("0" * 32) is None
    assert await stub.describe("../etc/passwd") is None


async def test_a_listing_whose_request_was_never_written_is_skipped(tmp_path: Path) -> None:
    # A crash between the listing and the request file leaves a name and nothing else.
    stub = StubProvider(settings(tmp_path), Clock())
    listing = tmp_path / "state" / "by-job" / JOB_A
    listing.mkdir(parents=True)
    (listing / ("f" * 32)).touch()
    assert await stub.find_requests(JOB_A) == []

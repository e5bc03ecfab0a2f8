"""What the two fake vendors share: generations that run on a clock, real output images,
expiring output files, a scripting API for faults, and a record of every request.

A generation (a Replicate prediction, a fal queue request) is created by a submit and then
runs on the fake's clock: it waits ``start_delay`` seconds (Replicate ``starting``, fal
``IN_QUEUE``), works ``duration`` seconds in ``steps`` steps (``processing`` /
``IN_PROGRESS``, each step logged as a tqdm progress line, the way diffusion models log),
then ends. Its state is computed from the clock whenever it is asked for, so nothing has to
tick in the background. While it runs, the fake reads the input image (fetched from its URL,
or decoded from a ``data:`` URI) and renders the outputs: a mirrored, colour-inverted copy
per output, PNG, served from the fake itself under an unguessable path that stops working
``output_ttl`` seconds after the generation ended (both vendors delete outputs after a
retention period; an expired file answers 404 as a deleted object would).

Scripting (all thread-safe, callable from the test while the fake serves):

- ``pace(start_delay=, duration=, steps=)``: how long the next generations take.
- ``fail_next(...)``: the next submits end as a provider failure.
- ``hold(progress=)`` / ``release()``: generations stay running at ``progress`` % until
  released (for a cancel mid-run, or a worker killed while it polls).
- ``throttle(times, retry_after=, on=)``: the next matching requests answer 429.
- ``server_errors(times, status=, on=)``: the next matching requests answer 5xx.
- ``lose_submit_responses(times, mode="close"|"hang")``: the submit is accepted and the
  generation exists and runs, then the connection is closed without an answer (or held
  open without one until ``hang_seconds`` pass).
- ``expire_outputs_at_completion()`` / ``output_ttl``: output URLs already dead when the
  generation ends.

Observation: ``submits`` (every accepted submit, with its headers, body and query),
``cancels``, ``requests`` (every request with the operation it named and the status it
got), ``max_in_flight(key)`` (the most generations that were running at once, per client
tag), ``wait_for(predicate)``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import math
import secrets
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from PIL import Image, ImageDraw, ImageOps

from tests.support.fakes.runner import ThreadedServer

# An operation any fault may be scripted on; the vendors name theirs ("create", "get",
# "cancel", "result", "status", "file").
ANY = "any"


class InputImageError(Exception):
    """The input image could not be read: the generation fails as the model would."""


@dataclass(frozen=True)
class Pace:
    start_delay: float = 0.05
    duration: float = 0.4
    steps: int = 8


@dataclass(frozen=True)
class Outcome:
    """How a generation ends. ``error`` set means it fails with that message; the fal
    fake also uses ``status``/``error_type``/``retryable`` for its error answer."""

    error: str | None = None
    status: int = 422
    error_type: str = "internal_server_error"
    retryable: bool | None = None


@dataclass
class Fault:
    kind: str  # "throttle" | "server_error" | "lose"
    operations: frozenset[str]
    times: int
    status: int = 0
    retry_after: float = 0
    mode: str = "close"
    hang_seconds: float = 30.0

    def matches(self, operation: str) -> bool:
        return ANY in self.operations or operation in self.operations


@dataclass(frozen=True)
class Recorded:
    """One request the fake answered (or dropped: status 0)."""

    at: float
    method: str
    path: str
    operation: str
    status: int
    tag: str | None
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Submit:
    """A submit the fake accepted (whether or not its answer reached the client)."""

    generation_id: str
    at: float
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    tag: str | None
    response_lost: bool


@dataclass
class OutputFile:
    data: bytes
    content_type: str
    width: int
    height: int
    name: str


@dataclass
class Generation:
    id: str
    model: str
    created: float  # monotonic
    created_wall: float
    input: dict[str, Any]
    tag: str | None
    pace: Pace
    outcome: Outcome
    output_ttl: float
    num_outputs: int = 1
    held_at: int | None = None  # progress % while held
    released: float | None = None
    canceled: float | None = None
    render_done: float | None = None
    render_error: str | None = None
    outputs: list[str] = field(default_factory=list)  # file ids
    extra: dict[str, Any] = field(default_factory=dict)

    def work_ends(self) -> float:
        end = self.created + self.pace.start_delay + self.pace.duration
        if self.held_at is not None:
            end = max(end, self.released if self.released is not None else math.inf)
        if self.render_done is None:
            return math.inf
        return max(end, self.render_done)

    def ended_at(self) -> float:
        """When the generation stopped running (inf while it runs)."""
        if self.canceled is not None:
            return min(self.canceled, self.work_ends())
        return self.work_ends()

    def phase(self, now: float) -> str:
        """queued | running | succeeded | failed | canceled."""
        if self.canceled is not None and self.canceled <= self.work_ends():
            return "canceled"
        if now < self.created + self.pace.start_delay:
            return "queued"
        if now < self.work_ends():
            return "running"
        if self.outcome.error is not None or self.render_error is not None:
            return "failed"
        return "succeeded"

    def error_message(self) -> str | None:
        return self.outcome.error if self.outcome.error is not None else self.render_error

    def steps_done(self, now: float) -> int:
        steps = self.pace.steps
        if now < self.created + self.pace.start_delay:
            return 0
        if self.phase(now) in ("succeeded", "failed"):
            return steps
        fraction = (now - self.created - self.pace.start_delay) / max(self.pace.duration, 1e-6)
        done = min(steps - 1, int(fraction * steps))
        if self.held_at is not None and self.released is None:
            done = min(done, (self.held_at * steps) // 100)
        return max(0, done)

    def progress_lines(self, now: float) -> list[str]:
        """tqdm-style lines, one per finished step, as diffusion models print them."""
        steps = self.pace.steps
        lines = []
        for step in range(1, self.steps_done(now) + 1):
            percent = (100 * step) // steps
            bar = ("#" * (percent // 10)).ljust(10)
            lines.append(f"{percent:3d}%|{bar}| {step}/{steps} [00:00<00:00, 9.99it/s]")
        return lines


class VendorFake:
    """The shared engine; ``ReplicateFake`` and ``FalFake`` add the vendor's routes."""

    # Overridden by each vendor: how long its outputs live by default.
    default_output_ttl = 3600.0

    def __init__(self, token: str, *, tag_header: str | None = None) -> None:
        self.token = token
        self.tag_header = tag_header.lower() if tag_header else None
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.generations: dict[str, Generation] = {}
        self.files: dict[str, OutputFile] = {}
        self.file_owner: dict[str, str] = {}
        self.submits: list[Submit] = []
        self.cancels: list[str] = []
        self.requests: list[Recorded] = []
        self.output_ttl = self.default_output_ttl
        self._pace = Pace()
        self._outcomes: list[Outcome] = []
        self._faults: list[Fault] = []
        self._hold: int | None = None
        self._ids = itertools.count(1)
        self._server: ThreadedServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> str:
        self._server = ThreadedServer(self.make_app)
        self.url = self._server.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> VendorFake:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024**2)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        app.router.add_get("/_fake/state", self._state_view)
        app.router.add_post("/_fake/control", self._control_view)
        self.add_routes(app)
        return app

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def _open_session(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15))

    async def _close_session(self, _: web.Application) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    # ---- scripting -------------------------------------------------------------------

    def pace(self, start_delay: float = 0.05, duration: float = 0.4, steps: int = 8) -> None:
        with self.lock:
            self._pace = Pace(start_delay, duration, steps)

    def fail_next(self, error: str = "the model failed", times: int = 1, **fal: Any) -> None:
        with self.lock:
            self._outcomes.extend(Outcome(error=error, **fal) for _ in range(times))

    def hold(self, progress: int = 50) -> None:
        """Generations submitted from now on stop at ``progress`` % until ``release()``."""
        with self.lock:
            self._hold = progress

    def release(self) -> None:
        with self.changed:
            self._hold = None
            now = time.monotonic()
            for generation in self.generations.values():
                if generation.held_at is not None and generation.released is None:
                    generation.released = now
            self.changed.notify_all()

    def throttle(self, times: int = 1, retry_after: float = 1, on: Iterable[str] = (ANY,)) -> None:
        with self.lock:
            self._faults.append(
                Fault("throttle", frozenset(on), times, status=429, retry_after=retry_after)
            )

    def server_errors(self, times: int = 1, status: int = 503, on: Iterable[str] = (ANY,)) -> None:
        with self.lock:
            self._faults.append(Fault("server_error", frozenset(on), times, status=status))

    def lose_submit_responses(
        self, times: int = 1, mode: str = "close", hang_seconds: float = 30.0
    ) -> None:
        assert mode in ("close", "hang")
        with self.lock:
            self._faults.append(
                Fault("lose", frozenset({"create"}), times, mode=mode, hang_seconds=hang_seconds)
            )

    def expire_outputs_at_completion(self, expire: bool = True) -> None:
        with self.lock:
            self.output_ttl = 0.0 if expire else self.default_output_ttl

    # ---- observation -----------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Blocks until ``predicate()`` (called under the fake's lock) holds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake vendor: condition not met within {timeout} s")
                # Generations also change with the clock: look again at least every 50 ms.
                self.changed.wait(min(left, 0.05))

    async def wait_for_async(self, predicate: Callable[[], bool], within: float = 30.0) -> None:
        await asyncio.to_thread(self.wait_for, predicate, within)

    def submit_count(self, where: Callable[[Submit], bool] | None = None) -> int:
        with self.lock:
            return sum(1 for submit in self.submits if where is None or where(submit))

    def phase_of(self, generation_id: str) -> str:
        with self.lock:
            return self.generations[generation_id].phase(time.monotonic())

    def max_in_flight(
        self, key: Callable[[Generation], str | None] | None = None
    ) -> dict[str | None, int]:
        """Per key (the client tag by default), the most generations that ran at the same
        moment: from their submit until they ended (finished, failed or canceled)."""
        keyed = key or (lambda generation: generation.tag)
        edges: dict[str | None, list[tuple[float, int]]] = {}
        with self.lock:
            for generation in self.generations.values():
                bucket = edges.setdefault(keyed(generation), [])
                bucket.append((generation.created, 1))
                bucket.append((generation.ended_at(), -1))
        most: dict[str | None, int] = {}
        for tag, bucket in edges.items():
            # An end and a start at the same instant do not overlap: ends sort first.
            bucket.sort()
            running = peak = 0
            for _, change in bucket:
                running += change
                peak = max(peak, running)
            most[tag] = peak
        return most

    def requests_for(self, operation: str) -> list[Recorded]:
        with self.lock:
            return [request for request in self.requests if request.operation == operation]

    # ---- shared request machinery ------------------------------------------------------

    def operation_of(self, request: web.Request) -> str:
        # Route names are "operation" or "operation:variant".
        name = request.match_info.route.name
        return name.split(":")[0] if name else "other"

    def tag_of(self, headers: Mapping[str, str]) -> str | None:
        if self.tag_header is None:
            return None
        return headers.get(self.tag_header)

    def check_auth(self, request: web.Request) -> web.Response | None:
        raise NotImplementedError

    def fault_response(self, fault: Fault) -> web.Response:
        raise NotImplementedError

    def _take_fault(self, operation: str, kinds: tuple[str, ...]) -> Fault | None:
        with self.lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.times > 0 and fault.matches(operation):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def take_lost_response(self) -> Fault | None:
        return self._take_fault("create", ("lose",))

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/_fake/"):
            return await handler(request)
        operation = self.operation_of(request)
        headers = {name.lower(): value for name, value in request.headers.items()}
        status = 0
        try:
            response: web.StreamResponse | None = None
            if operation != "file":
                response = self.check_auth(request)
            if response is None:
                fault = self._take_fault(operation, ("throttle", "server_error"))
                if fault is not None:
                    response = self.fault_response(fault)
            if response is None:
                response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as error:
            status = error.status
            raise
        finally:
            with self.changed:
                self.requests.append(
                    Recorded(
                        time.monotonic(),
                        request.method,
                        request.path_qs,
                        operation,
                        status,
                        self.tag_of(headers),
                        headers,
                    )
                )
                self.changed.notify_all()

    def new_id(self) -> str:
        # Unique, unguessable-looking and still ordered for humans reading a log.
        return f"{next(self._ids):04d}{secrets.token_hex(6)}"

    def create_generation(
        self,
        *,
        model: str,
        input: dict[str, Any],
        headers: Mapping[str, str],
        image_ref: str | None,
        num_outputs: int,
        output_ttl: float | None = None,
    ) -> Generation:
        now = time.monotonic()
        with self.changed:
            outcome = self._outcomes.pop(0) if self._outcomes else Outcome()
            generation = Generation(
                id=self.new_id(),
                model=model,
                created=now,
                created_wall=time.time(),
                input=input,
                tag=self.tag_of(headers),
                pace=self._pace,
                outcome=outcome,
                output_ttl=self.output_ttl if output_ttl is None else output_ttl,
                num_outputs=max(1, num_outputs),
                held_at=self._hold,
            )
            self.generations[generation.id] = generation
            self.changed.notify_all()
        task = asyncio.get_running_loop().create_task(self._render(generation, image_ref))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return generation

    def record_submit(
        self, generation: Generation, request: web.Request, body: Mapping[str, Any], lost: bool
    ) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self.changed:
            self.submits.append(
                Submit(
                    generation.id,
                    time.monotonic(),
                    request.path,
                    dict(request.query),
                    headers,
                    body,
                    generation.tag,
                    lost,
                )
            )
            self.changed.notify_all()

    def cancel_generation(self, generation: Generation) -> bool:
        """True when the generation was still running and is now canceled."""
        now = time.monotonic()
        with self.changed:
            self.cancels.append(generation.id)
            accepted = generation.phase(now) in ("queued", "running")
            if accepted:
                generation.canceled = now
            self.changed.notify_all()
        return accepted

    async def drop_response(self, request: web.Request, fault: Fault) -> web.Response:
        """The submit was accepted; the client never hears so."""
        if fault.mode == "hang":
            await asyncio.sleep(fault.hang_seconds)
        transport = request.transport
        if transport is not None:
            transport.abort()
        # Nothing reaches the client; aiohttp gives up writing to the aborted transport.
        raise asyncio.CancelledError

    async def _render(self, generation: Generation, image_ref: str | None) -> None:
        try:
            if image_ref is None:
                raise InputImageError("no input image was given")
            data = await self._load_input(image_ref)
            rendered = [render_output(data, index) for index in range(generation.num_outputs)]
        except InputImageError as error:
            with self.changed:
                generation.render_error = str(error)
                generation.render_done = time.monotonic()
                self.changed.notify_all()
            return
        with self.changed:
            for index, (png, width, height) in enumerate(rendered):
                file_id = secrets.token_urlsafe(18)
                self.files[file_id] = OutputFile(
                    png, "image/png", width, height, f"out-{index}.png"
                )
                self.file_owner[file_id] = generation.id
                generation.outputs.append(file_id)
            generation.render_done = time.monotonic()
            self.changed.notify_all()

    async def _load_input(self, ref: str) -> bytes:
        if ref.startswith("data:"):
            header, _, payload = ref.partition(",")
            try:
                if header.endswith(";base64"):
                    return base64.b64decode(payload, validate=True)
                return urllib.parse.unquote_to_bytes(payload)
            except ValueError as error:
                raise InputImageError("the data URI does not decode") from error
        if not ref.startswith(("http://", "https://")):
            raise InputImageError(f"not a URL or data URI: {ref[:40]!r}")
        assert self._session is not None
        try:
            async with self._session.get(ref) as response:
                if response.status != 200:
                    raise InputImageError(f"fetching the input image answered {response.status}")
                return await response.read()
        except aiohttp.ClientError as error:
            raise InputImageError(f"fetching the input image failed: {error}") from error

    def file_view_response(self, file_id: str) -> web.Response:
        """An output file, or the 404 a deleted object gets once its retention is over."""
        now = time.monotonic()
        with self.lock:
            output = self.files.get(file_id)
            owner = self.generations.get(self.file_owner.get(file_id, ""))
            if output is None or owner is None or owner.phase(now) != "succeeded":
                return web.Response(status=404, text="Not Found")
            if now >= owner.ended_at() + owner.output_ttl:
                return web.Response(status=404, text="Not Found")
        return web.Response(body=output.data, content_type=output.content_type)

    # ---- subprocess control ------------------------------------------------------------

    CONTROL = (
        "pace",
        "fail_next",
        "hold",
        "release",
        "throttle",
        "server_errors",
        "lose_submit_responses",
        "expire_outputs_at_completion",
    )

    async def _control_view(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("method")
        if name not in self.CONTROL:
            return web.json_response({"error": f"unknown control {name!r}"}, status=400)
        getattr(self, name)(**body.get("kwargs", {}))
        return web.json_response({"ok": True})

    async def _state_view(self, _: web.Request) -> web.Response:
        now = time.monotonic()
        with self.lock:
            state = {
                "submits": [
                    {"id": s.generation_id, "tag": s.tag, "lost": s.response_lost}
                    for s in self.submits
                ],
                "cancels": list(self.cancels),
                "generations": {g.id: g.phase(now) for g in self.generations.values()},
            }
        state["max_in_flight"] = {str(k): v for k, v in self.max_in_flight().items()}
        return web.json_response(state)


def render_output(data: bytes, index: int) -> tuple[bytes, int, int]:
    """A visibly transformed copy of the input: mirrored, colours inverted, and a white bar
    per output index along the top, as PNG."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            upright = ImageOps.exif_transpose(opened)
            image = upright.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise InputImageError(f"the input is not an image: {error}") from error
    styled = ImageOps.mirror(ImageOps.invert(image))
    draw = ImageDraw.Draw(styled)
    for bar in range(index):
        draw.rectangle((bar * 6, 0, bar * 6 + 3, 3), fill=(255, 255, 255))
    buffer = io.BytesIO()
    styled.save(buffer, "PNG")
    return buffer.getvalue(), styled.width, styled.height


def base_url(request: web.Request) -> str:
    """The fake's own origin as the client reached it (URLs in answers point back here)."""
    return f"{request.scheme}://{request.host}"


async def json_object(request: web.Request) -> dict[str, Any] | None:
    """The request's JSON body when it is an object, else None (the vendor's 4xx)."""
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None

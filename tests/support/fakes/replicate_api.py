"""A fake of Replicate's HTTP predictions API, written from Replicate's public
documentation (replicate.com/docs: "HTTP API reference", "Create a prediction",
"Prediction lifecycle", "Rate limits", "Output files", "Data retention"), not from any
client of it.

Documented behaviour this fake follows:

- ``POST /v1/predictions`` with ``{"version": ..., "input": {...}}`` (optionally
  ``webhook``, ``webhook_events_filter``) creates a prediction for a model version;
  ``POST /v1/models/{owner}/{name}/predictions`` with ``{"input": {...}}`` creates one for
  an official model. Both answer **201** with the prediction object: ``id``, ``model``,
  ``version``, ``input``, ``logs``, ``output``, ``error``, ``status``, ``created_at``,
  ``started_at``, ``completed_at``, ``data_removed``, ``metrics`` and ``urls`` with
  ``get``/``cancel``/``stream``/``web``.
- ``Prefer: wait`` (or ``wait=N``, 1-60 s, default 60) holds the create request open until
  the prediction ends or the time is up, then answers with the prediction as it stands
  (status may still be ``starting``/``processing``), with a ``Location`` header naming
  ``urls.get``.
- ``GET /v1/predictions/{id}`` answers the prediction; ``POST /v1/predictions/{id}/cancel``
  cancels it and answers the prediction (a prediction that already ended is answered
  unchanged); ``GET /v1/predictions`` lists predictions newest first, cursor-paginated
  (``next``/``previous``/``results``). An unknown id answers 404 ``{"detail": "Not
  found."}``.
- ``status`` is one of ``starting``, ``processing``, ``succeeded``, ``failed``,
  ``canceled``; ``error`` carries the failure; ``logs`` is the model's printed output (here
  tqdm progress lines, one per step, which Replicate's clients parse for progress);
  ``output`` is a list of HTTPS file URLs once succeeded; ended predictions carry
  ``metrics.predict_time``.
- Authentication is ``Authorization: Bearer <token>`` (``Token <token>`` also accepted,
  as older docs show). Missing or wrong: 401 ``{"title": "Unauthenticated", "detail":
  "You did not pass a valid authentication token", "status": 401}``.
- Invalid input: 422 with ``title``/``detail``/``status`` (and ``invalid_fields``); an
  unknown version: 422 ``"Invalid version or not permitted"``.
- Rate limits (600 creates/min, 3000 other requests/min): 429 ``{"detail": "Request was
  throttled. Expected available in N seconds."}`` with a ``Retry-After`` header (scripted
  here with ``throttle()``).
- Output files are served from a delivery host and deleted an hour after the prediction
  (API predictions); a deleted file answers 404. Here the files are served by the fake
  itself under ``/delivery/...`` and die ``output_ttl`` seconds (default 3600) after the
  prediction ended.

Not documented, chosen here: 5xx bodies are ``{"detail": "..."}`` JSON; a canceled
prediction's ``completed_at`` is its cancel time; output files need no authorization.

Client reference: Replicate's create takes no idempotency key and no free-form metadata.
The only caller-chosen strings a prediction carries are its ``input`` and its ``webhook``
URL; an orphan (a create whose answer was lost) can be found afterwards only by listing
predictions (``GET /v1/predictions``) and matching ``created_at``/``input``. The fake
records every create (``submits``), so tests count them per job by matching the input or
a header.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from tests.support.fakes.runner import serve_main
from tests.support.fakes.vendor import Fault, Generation, VendorFake, base_url, json_object

# Input keys an image-to-image model takes its photo under (models differ).
IMAGE_KEYS = ("image", "input_image", "image_url", "init_image")
UNAUTHENTICATED = {
    "title": "Unauthenticated",
    "detail": "You did not pass a valid authentication token",
    "status": 401,
}


def iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, UTC).isoformat().replace("+00:00", "Z")


class ReplicateFake(VendorFake):
    default_output_ttl = 3600.0

    def __init__(
        self,
        token: str,
        *,
        tag_header: str | None = None,
        known_versions: set[str] | None = None,
    ) -> None:
        super().__init__(token, tag_header=tag_header)
        # None: any version is accepted; a set: others answer 422 as an unknown version.
        self.known_versions = known_versions

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/predictions", self._create_version, name="create")
        app.router.add_get("/v1/predictions", self._list, name="list")
        app.router.add_post(
            "/v1/models/{owner}/{name}/predictions", self._create_official, name="create:model"
        )
        app.router.add_get("/v1/predictions/{id}", self._get, name="get")
        app.router.add_post("/v1/predictions/{id}/cancel", self._cancel, name="cancel")
        app.router.add_get("/delivery/{file_id}/{name}", self._file, name="file")

    # ---- protocol ----------------------------------------------------------------------

    def check_auth(self, request: web.Request) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme in ("Bearer", "Token") and token.strip() == self.token:
            return None
        return web.json_response(UNAUTHENTICATED, status=401)

    def fault_response(self, fault: Fault) -> web.Response:
        if fault.kind == "throttle":
            seconds = max(1, round(fault.retry_after))
            unit = "second" if seconds == 1 else "seconds"
            return web.json_response(
                {"detail": f"Request was throttled. Expected available in {seconds} {unit}."},
                status=429,
                headers={"Retry-After": str(seconds)},
            )
        return web.json_response({"detail": "Internal server error"}, status=fault.status)

    def prediction(self, generation: Generation, base: str) -> dict[str, Any]:
        now = time.monotonic()
        phase = generation.phase(now)
        status = {
            "queued": "starting",
            "running": "processing",
            "succeeded": "succeeded",
            "failed": "failed",
            "canceled": "canceled",
        }[phase]
        started = None
        if phase != "queued" and now >= generation.created + generation.pace.start_delay:
            started = generation.created_wall + generation.pace.start_delay
        ended = phase in ("succeeded", "failed", "canceled")
        completed = None
        if ended:
            completed = generation.created_wall + (generation.ended_at() - generation.created)
        get_url = f"{base}/v1/predictions/{generation.id}"
        body: dict[str, Any] = {
            "id": generation.id,
            "model": generation.model,
            "version": generation.extra["version"],
            "input": generation.input,
            "logs": "\n".join(generation.progress_lines(now)),
            "output": None,
            "data_removed": False,
            "error": generation.error_message() if phase == "failed" else None,
            "status": status,
            "source": "api",
            "created_at": iso(generation.created_wall),
            "started_at": iso(started),
            "completed_at": iso(completed),
            "urls": {
                "get": get_url,
                "cancel": f"{get_url}/cancel",
                "stream": f"{base}/stream/{generation.id}",
                "web": f"{base}/p/{generation.id}",
            },
            "metrics": {},
        }
        if ended and started is not None and completed is not None:
            body["metrics"] = {"predict_time": round(completed - started, 6)}
        if phase == "succeeded":
            body["output"] = [
                f"{base}/delivery/{file_id}/{self.files[file_id].name}"
                for file_id in generation.outputs
            ]
        return body

    async def _create_version(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        version = body.get("version")
        if not isinstance(version, str) or not version:
            return self._invalid("version", "version is required")
        model = "owner/model"
        if ":" in version:
            model, _, version = version.partition(":")
        elif "/" in version:
            model, version = version, self._version_of(version)
        if self.known_versions is not None and version not in self.known_versions:
            return web.json_response(
                {
                    "title": "Invalid version or not permitted",
                    "detail": "The specified version does not exist (or perhaps you don't"
                    " have permission to use it?)",
                    "status": 422,
                },
                status=422,
            )
        return await self._create(request, body, model=model, version=version)

    async def _create_official(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        model = f"{request.match_info['owner']}/{request.match_info['name']}"
        return await self._create(request, body, model=model, version=self._version_of(model))

    @staticmethod
    def _version_of(model: str) -> str:
        return hashlib.sha256(model.encode()).hexdigest()

    async def _create(
        self, request: web.Request, body: dict[str, Any], *, model: str, version: str
    ) -> web.StreamResponse:
        model_input = body.get("input")
        if not isinstance(model_input, dict):
            return self._invalid("input", "input is required and must be an object")
        image_ref = next(
            (model_input[key] for key in IMAGE_KEYS if isinstance(model_input.get(key), str)),
            None,
        )
        num_outputs = model_input.get("num_outputs", 1)
        if not isinstance(num_outputs, int) or not 1 <= num_outputs <= 4:
            return self._invalid("num_outputs", "Must be between 1 and 4")
        headers = {name.lower(): value for name, value in request.headers.items()}
        generation = self.create_generation(
            model=model,
            input=model_input,
            headers=headers,
            image_ref=image_ref,
            num_outputs=num_outputs,
        )
        generation.extra["version"] = version
        lost = self.take_lost_response()
        self.record_submit(generation, request, body, lost is not None)
        if lost is not None:
            return await self.drop_response(request, lost)
        wait = self._prefer_wait(request.headers.get("Prefer", ""))
        if wait is not None:
            with contextlib.suppress(TimeoutError):
                await self.wait_for_async(
                    lambda: generation.phase(time.monotonic()) not in ("queued", "running"),
                    within=wait,
                )
        answer = web.json_response(self.prediction(generation, base_url(request)), status=201)
        if wait is not None:
            answer.headers["Location"] = f"{base_url(request)}/v1/predictions/{generation.id}"
        return answer

    @staticmethod
    def _prefer_wait(prefer: str) -> float | None:
        for part in prefer.split(","):
            name, _, value = part.strip().partition("=")
            if name.strip().lower() == "wait":
                try:
                    return float(min(60, max(1, int(value)))) if value else 60.0
                except ValueError:
                    return 60.0
        return None

    async def _get(self, request: web.Request) -> web.Response:
        generation = self.generations.get(request.match_info["id"])
        if generation is None:
            return web.json_response({"detail": "Not found."}, status=404)
        return web.json_response(self.prediction(generation, base_url(request)))

    async def _cancel(self, request: web.Request) -> web.Response:
        generation = self.generations.get(request.match_info["id"])
        if generation is None:
            return web.json_response({"detail": "Not found."}, status=404)
        self.cancel_generation(generation)
        return web.json_response(self.prediction(generation, base_url(request)))

    async def _list(self, request: web.Request) -> web.Response:
        with self.lock:
            newest_first = sorted(self.generations.values(), key=lambda g: g.created, reverse=True)
            results = [self.prediction(g, base_url(request)) for g in newest_first]
        return web.json_response({"next": None, "previous": None, "results": results})

    async def _file(self, request: web.Request) -> web.Response:
        return self.file_view_response(request.match_info["file_id"])

    # ---- helpers -----------------------------------------------------------------------

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any] | web.Response:
        body = await json_object(request)
        if body is None:
            return web.json_response(
                {
                    "title": "Invalid JSON",
                    "detail": "The request body is not a JSON object",
                    "status": 400,
                },
                status=400,
            )
        return body

    @staticmethod
    def _invalid(field_name: str, description: str) -> web.Response:
        return web.json_response(
            {
                "title": "Input validation failed",
                "detail": f"- {field_name}: {description}",
                "status": 422,
                "invalid_fields": [
                    {"type": "invalid", "field": field_name, "description": description}
                ],
            },
            status=422,
        )


def _make_app(arguments: Any) -> web.Application:
    return ReplicateFake(arguments.token, tag_header=arguments.tag_header).make_app()


if __name__ == "__main__":
    serve_main(_make_app, "A fake of Replicate's HTTP predictions API")

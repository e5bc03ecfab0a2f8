"""A fake of fal's queue API (``queue.fal.run``), written from fal's public documentation
(fal.ai/docs: "Queue" / "Asynchronous inference", the Inference API reference pages for
submit/status/result/cancel, "Request Error Types", "Errors", "Webhooks", "Data retention
& storage", "Concurrency limits"), not from any client of it.

Documented behaviour this fake follows:

- ``POST /{model_id}`` (``model_id`` = ``owner/app`` with an optional endpoint path, e.g.
  ``fal-ai/flux/dev``) queues a request. The answer carries ``request_id``,
  ``response_url``, ``status_url``, ``cancel_url`` and ``status: IN_QUEUE`` (with
  ``queue_position``). A ``fal_webhook`` query parameter is accepted and recorded.
- The status, result and cancel URLs use only ``owner/app`` (never the endpoint path):
  ``GET /{owner}/{app}/requests/{id}/status`` (``?logs=1`` adds the runner's logs),
  ``GET /{owner}/{app}/requests/{id}`` (the result),
  ``PUT /{owner}/{app}/requests/{id}/cancel``. A path that does not match answers 404.
- Status is ``IN_QUEUE`` (with ``queue_position``), ``IN_PROGRESS`` (with ``logs``: a list
  of ``{message, level, source, timestamp}``) or ``COMPLETED`` (with ``metrics``). The
  status answer is HTTP 202 while queued or in progress and 200 once completed.
- The result of an image model: ``{"images": [{"url", "content_type", "width", "height",
  "file_name", "file_size"}], "seed", "has_nsfw_concepts", "timings", "prompt"}``.
- Cancel answers 202 ``{"status": "CANCELLATION_REQUESTED"}`` for a queued or running
  request (a queued one is removed, a running one gets a cancellation signal), 400
  ``{"status": "ALREADY_COMPLETED"}`` once completed, 404 ``{"status": "NOT_FOUND"}``.
- Authentication is ``Authorization: Key <key>`` (a key is ``key_id:key_secret``); a
  wrong or missing key answers 401 ``{"detail": "No user found for Key ID and Secret"}``.
- Model errors answer the result request with the error's HTTP status and ``{"detail":
  [{"loc", "msg", "type", ...}]}``, optionally with ``X-Fal-Retryable: true|false``;
  infrastructure errors with ``{"detail": "...", "error_type": "..."}`` and the same value
  in ``X-Fal-Error-Type`` (e.g. 503 ``runner_disconnected``, 504 ``request_timeout``).
- Output media live on the fal CDN for a retention period; the
  ``X-Fal-Object-Lifecycle-Preference: {"expiration_duration_seconds": N}`` submit header
  sets it per request; an expired file is deleted (404). Here files are served by the fake
  under ``/files/...``.
- Over the account's concurrency limit requests wait ``IN_QUEUE`` rather than being
  refused: fal documents no 429 for queue submits. The fake still answers 429 (with
  ``Retry-After``) or 5xx when a test scripts it, as any HTTP gateway may.

Not documented, chosen here: the submit answers 200; a result asked for before completion
answers 400 ``{"detail": "Request is still in progress"}``; a failed request's COMPLETED
status also carries ``error`` and ``error_type``; a canceled request reports COMPLETED and
its result answers 400 ``{"detail": "Request was cancelled"}``; output files need no key;
the default retention is one hour.

Client reference: fal's submit takes no idempotency key either. The caller chooses the
``fal_webhook`` URL (which can carry a reference in its query) and may send any headers;
fal's platform API lists past requests per endpoint by time range, status or request id,
not by a caller's reference. The fake records every submit with its query and headers.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from tests.support.fakes.runner import serve_main
from tests.support.fakes.vendor import Fault, Generation, VendorFake, base_url, json_object

IMAGE_KEYS = ("image_url", "image", "input_image_url")
NO_USER = {"detail": "No user found for Key ID and Secret"}
LIFECYCLE_HEADER = "X-Fal-Object-Lifecycle-Preference"


class FalFake(VendorFake):
    default_output_ttl = 3600.0

    def __init__(self, token: str, *, tag_header: str | None = None) -> None:
        super().__init__(token, tag_header=tag_header)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/files/{file_id}/{name}", self._file, name="file")
        app.router.add_get("/{owner}/{app}/requests/{id}/status", self._status, name="status")
        app.router.add_put("/{owner}/{app}/requests/{id}/cancel", self._cancel, name="cancel")
        app.router.add_get("/{owner}/{app}/requests/{id}", self._result, name="result")
        app.router.add_post("/{owner}/{app}", self._submit, name="create")
        app.router.add_post("/{owner}/{app}/{path:.+}", self._submit, name="create:path")
        app.router.add_get("/{owner}/{app}/{path:.+}", self._not_found, name="other")
        app.router.add_put("/{owner}/{app}/{path:.+}", self._not_found, name="other:put")

    # ---- protocol ----------------------------------------------------------------------

    def check_auth(self, request: web.Request) -> web.Response | None:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Key" and key.strip() == self.token:
            return None
        return web.json_response(NO_USER, status=401)

    def fault_response(self, fault: Fault) -> web.Response:
        if fault.kind == "throttle":
            seconds = max(1, round(fault.retry_after))
            return web.json_response(
                {"detail": "Too many requests"},
                status=429,
                headers={"Retry-After": str(seconds)},
            )
        error_type = "runner_disconnected" if fault.status == 503 else "internal_server_error"
        return web.json_response(
            {"detail": "Internal server error", "error_type": error_type},
            status=fault.status,
            headers={"X-Fal-Error-Type": error_type},
        )

    def urls(self, generation: Generation, base: str) -> dict[str, str]:
        response_url = f"{base}/{generation.model}/requests/{generation.id}"
        return {
            "response_url": response_url,
            "status_url": f"{response_url}/status",
            "cancel_url": f"{response_url}/cancel",
        }

    def _find(self, request: web.Request) -> Generation | None:
        generation = self.generations.get(request.match_info["id"])
        app = f"{request.match_info['owner']}/{request.match_info['app']}"
        if generation is None or generation.model != app:
            return None
        return generation

    def _queue_position(self, generation: Generation, now: float) -> int:
        with self.lock:
            return sum(
                1
                for other in self.generations.values()
                if other.model == generation.model
                and other.created < generation.created
                and other.phase(now) == "queued"
            )

    async def _submit(self, request: web.Request) -> web.StreamResponse:
        body = await json_object(request)
        if body is None:
            return web.json_response(
                {
                    "detail": [
                        {
                            "loc": ["body"],
                            "msg": "Input should be an object",
                            "type": "model_attributes_type",
                        }
                    ]
                },
                status=422,
            )
        owner, app = request.match_info["owner"], request.match_info["app"]
        image_ref = next((body[key] for key in IMAGE_KEYS if isinstance(body.get(key), str)), None)
        num_images = body.get("num_images", 1)
        if not isinstance(num_images, int) or not 1 <= num_images <= 4:
            return web.json_response(
                {
                    "detail": [
                        {
                            "loc": ["body", "num_images"],
                            "msg": "Input should be between 1 and 4",
                            "type": "less_than_equal",
                        }
                    ]
                },
                status=422,
            )
        ttl = self._lifecycle_ttl(request.headers.get(LIFECYCLE_HEADER))
        if isinstance(ttl, web.Response):
            return ttl
        headers = {name.lower(): value for name, value in request.headers.items()}
        generation = self.create_generation(
            model=f"{owner}/{app}",
            input=body,
            headers=headers,
            image_ref=image_ref,
            num_outputs=num_images,
            output_ttl=None if ttl is None else min(ttl, self.output_ttl),
        )
        generation.extra["endpoint"] = request.path.lstrip("/")
        lost = self.take_lost_response()
        self.record_submit(generation, request, body, lost is not None)
        if lost is not None:
            return await self.drop_response(request, lost)
        now = time.monotonic()
        answer = {
            "status": "IN_QUEUE",
            "request_id": generation.id,
            "queue_position": self._queue_position(generation, now),
            **self.urls(generation, base_url(request)),
        }
        return web.json_response(answer, headers={"x-fal-request-id": generation.id})

    @staticmethod
    def _lifecycle_ttl(value: str | None) -> float | web.Response | None:
        if value is None:
            return None
        try:
            preference = json.loads(value)
            seconds = preference.get("expiration_duration_seconds")
        except (ValueError, AttributeError):
            return web.json_response({"detail": f"Invalid {LIFECYCLE_HEADER} header"}, status=400)
        return None if seconds is None else float(seconds)

    async def _status(self, request: web.Request) -> web.Response:
        generation = self._find(request)
        if generation is None:
            return web.json_response({"detail": "Request not found"}, status=404)
        now = time.monotonic()
        phase = generation.phase(now)
        with_logs = request.query.get("logs") in ("1", "true")
        logs = None
        if with_logs:
            stamp = datetime.now(UTC).isoformat()
            logs = [
                {"message": line, "level": "INFO", "source": "stdout", "timestamp": stamp}
                for line in generation.progress_lines(now)
            ]
        body: dict[str, Any] = {**self.urls(generation, base_url(request)), "logs": logs}
        if phase == "queued":
            body.update(status="IN_QUEUE", queue_position=self._queue_position(generation, now))
            return web.json_response(body, status=202)
        if phase == "running":
            body.update(status="IN_PROGRESS")
            return web.json_response(body, status=202)
        body.update(status="COMPLETED")
        if phase in ("succeeded", "failed"):
            start = generation.created + generation.pace.start_delay
            body["metrics"] = {"inference_time": round(generation.ended_at() - start, 6)}
        if phase == "failed":
            body.update(error=generation.error_message(), error_type=self._error_type(generation))
        return web.json_response(body, status=200)

    @staticmethod
    def _error_type(generation: Generation) -> str:
        if generation.render_error is not None and generation.outcome.error is None:
            return "file_download_error"
        return generation.outcome.error_type

    async def _result(self, request: web.Request) -> web.Response:
        generation = self._find(request)
        if generation is None:
            return web.json_response({"detail": "Request not found"}, status=404)
        now = time.monotonic()
        phase = generation.phase(now)
        if phase in ("queued", "running"):
            return web.json_response({"detail": "Request is still in progress"}, status=400)
        if phase == "canceled":
            return web.json_response({"detail": "Request was cancelled"}, status=400)
        if phase == "failed":
            return self._failure(generation)
        base = base_url(request)
        images = []
        for file_id in generation.outputs:
            output = self.files[file_id]
            images.append(
                {
                    "url": f"{base}/files/{file_id}/{output.name}",
                    "content_type": output.content_type,
                    "file_name": output.name,
                    "file_size": len(output.data),
                    "width": output.width,
                    "height": output.height,
                }
            )
        body = {
            "images": images,
            "seed": int(generation.id[:4]),
            "has_nsfw_concepts": [False] * len(images),
            "prompt": generation.input.get("prompt", ""),
            "timings": {"inference": generation.pace.duration},
        }
        return web.json_response(body, headers={"x-fal-request-id": generation.id})

    def _failure(self, generation: Generation) -> web.Response:
        outcome = generation.outcome
        message = generation.error_message() or "failed"
        error_type = self._error_type(generation)
        headers: dict[str, str] = {}
        if generation.render_error is not None and outcome.error is None:
            status = 422
            body: dict[str, Any] = {
                "detail": [{"loc": ["body", "image_url"], "msg": message, "type": error_type}]
            }
        elif outcome.status >= 500:
            status = outcome.status
            body = {"detail": message, "error_type": error_type}
            headers["X-Fal-Error-Type"] = error_type
        else:
            status = outcome.status
            body = {"detail": [{"loc": ["body"], "msg": message, "type": error_type}]}
        if outcome.retryable is not None:
            headers["X-Fal-Retryable"] = "true" if outcome.retryable else "false"
        return web.json_response(body, status=status, headers=headers)

    async def _cancel(self, request: web.Request) -> web.Response:
        generation = self._find(request)
        if generation is None:
            return web.json_response({"status": "NOT_FOUND"}, status=404)
        if self.cancel_generation(generation):
            return web.json_response({"status": "CANCELLATION_REQUESTED"}, status=202)
        return web.json_response({"status": "ALREADY_COMPLETED"}, status=400)

    async def _file(self, request: web.Request) -> web.Response:
        return self.file_view_response(request.match_info["file_id"])

    async def _not_found(self, _: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)


def _make_app(arguments: Any) -> web.Application:
    return FalFake(arguments.token, tag_header=arguments.tag_header).make_app()


if __name__ == "__main__":
    serve_main(_make_app, "A fake of fal's queue API")

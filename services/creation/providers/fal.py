"""fal's queue API behind the two-phase interface.

``submit`` posts the model's input to ``{queue}/{model id}`` (the model id may carry an
endpoint path, e.g. ``fal-ai/flux/dev/image-to-image``). fal answers with a request id and
the URLs of its status, result and cancel endpoints, which use only the owner and the app
(no endpoint path); we keep the result URL's path, ``{owner}/{app}/requests/{id}``, as the
job's request id, so a resumed worker can poll it without the catalog.

``poll`` reads ``.../status?logs=1``: ``IN_QUEUE`` and ``IN_PROGRESS`` are Running (progress
is the last percentage in the logs), ``COMPLETED`` fetches the result (``GET .../{id}``),
whose ``images`` are downloaded. ``cancel`` is ``PUT .../cancel``.

fal takes no idempotency key and no client reference on submit: a submit whose answer was
lost cannot be found by us and is an unknown outcome (NEEDS_ATTENTION); the attempt's
``submit_outcome_unknown`` warning (job id, ``submit_started_at``) lets an operator match
it in fal's request list for the endpoint.
"""

from __future__ import annotations

from typing import Any

import httpx

from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    PollResult,
    ProviderError,
    Running,
)
from services.creation.providers.hosted.adapter import HostedAdapter
from services.creation.providers.hosted.http import (
    Call,
    json_or_none,
    progress_from_logs,
    short,
    status_error,
    unexpected_body,
)
from services.creation.providers.hosted.models import BadModel, model_input, split_model
from services.creation.settings import ProviderSettings, VendorSettings

CODE = "fal"
# fal's error types (model errors' ``detail[].type``, request errors' ``error_type``).
_CONTENT = frozenset({"content_policy_violation"})
_INPUT = frozenset(
    {
        "image_load_error",
        "file_download_error",
        "unsupported_image_format",
        "image_too_large",
        "image_too_small",
        "file_too_large",
        "face_detection_error",
    }
)
_TRANSIENT = frozenset(
    {
        "internal_server_error",
        "generation_timeout",
        "downstream_service_error",
        "downstream_service_unavailable",
        "request_timeout",
        "startup_timeout",
        "runner_scheduling_failure",
        "runner_connection_timeout",
        "runner_disconnected",
        "runner_connection_refused",
        "runner_connection_error",
        "runner_incomplete_response",
        "runner_server_error",
    }
)


def _error_types(body: object, headers: httpx.Headers | None = None) -> tuple[list[str], str]:
    """fal's error types and message from an error body (a model error's ``detail`` list,
    or a request error's ``detail`` string with ``error_type``)."""
    types: list[str] = []
    messages: list[str] = []
    if headers is not None and headers.get("x-fal-error-type"):
        types.append(headers["x-fal-error-type"])
    if isinstance(body, dict):
        if isinstance(body.get("error_type"), str):
            types.append(body["error_type"])
        detail = body.get("detail")
        if isinstance(body.get("error"), str):
            messages.append(body["error"])
        if isinstance(detail, str):
            messages.append(detail)
        elif isinstance(detail, list):
            for item in detail:
                if isinstance(item, dict):
                    if isinstance(item.get("type"), str):
                        types.append(item["type"])
                    if isinstance(item.get("msg"), str):
                        messages.append(item["msg"])
    return types, short("; ".join(messages))


def failure_of(types: list[str], message: str, *, server_error: bool) -> Failed:
    """A failed request on the failure table: by fal's error types first, else by the
    kind of status (fal bills no 5xx, so a server-side failure is worth another try)."""
    text = message or "the request failed"
    if _CONTENT.intersection(types):
        return Failed("CONTENT_REJECTED", text, retryable=False)
    if _INPUT.intersection(types):
        return Failed("INPUT_UNREADABLE", text, retryable=False)
    if _TRANSIENT.intersection(types) or server_error:
        return Failed("TRANSIENT", text, retryable=True)
    return Failed("INVALID_INPUT", text, retryable=False)


def _image_urls(result: object) -> list[str]:
    if not isinstance(result, dict):
        return []
    images: Any = result.get("images")
    if images is None and result.get("image") is not None:
        images = [result["image"]]
    urls = []
    for image in images if isinstance(images, list) else []:
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url:
            urls.append(url)
    return urls


class FalProvider(HostedAdapter):
    code = CODE
    version = "fal-queue-v1"
    supports_idempotent_submit = False
    key_setting = "ATELIER_FAL_KEY"
    auth_scheme = "Key"
    # No RequestLookup: a queued request carries no client reference and fal lists none
    # by one (the module's docstring).
    lookup_note = (
        "fal keeps no client reference on a queued request, so it cannot be found by job"
        " id: match the job's submit_outcome_unknown log line (job id, submit_started_at)"
        " against the endpoint's requests in fal's dashboard, then adopt"
        " '<owner>/<app>/requests/<request id>'"
    )

    @staticmethod
    def vendor_of(settings: ProviderSettings) -> VendorSettings:
        return settings.fal

    def _request_path(self, model: str, answer: dict[str, Any]) -> str:
        """Where the request lives: the result URL's path under our base URL, as fal
        hands it back; built from the owner and app when the answer lacks it."""
        request_id = str(answer["request_id"])
        response_url = answer.get("response_url")
        if isinstance(response_url, str):
            parsed = httpx.URL(response_url)
            base_path = httpx.URL(self._base_url).path.rstrip("/")
            path = parsed.path
            if path.startswith(base_path + "/"):
                path = path[len(base_path) :]
            path = path.strip("/")
            if path.endswith(f"/requests/{request_id}"):
                return path
        owner_app = "/".join(model.split("/")[:2])
        return f"{owner_app}/requests/{request_id}"

    async def submit(self, request: GenerationRequest, idempotency_key: str) -> str:
        self._require_key(Call.SUBMIT)
        try:
            model, options = split_model(
                request.provider_model, image_field="image_url", size="image_size"
            )
        except BadModel as error:
            raise ProviderError("INVALID_INPUT", str(error), retryable=False) from None
        if model.count("/") < 1 or "?" in model or model.startswith("/"):
            raise ProviderError("INVALID_INPUT", f"not a fal model id: {model!r}", retryable=False)
        body = model_input(request, options, "num_images")
        response = await self._send(Call.SUBMIT, "POST", f"/{model}", json=body)
        if response.status_code in (200, 201, 202):
            answer = json_or_none(response)
            if isinstance(answer, dict) and isinstance(answer.get("request_id"), str):
                return self._request_path(model, answer)
            raise unexpected_body(Call.SUBMIT, "has no request_id")
        raise self._refusal(response, Call.SUBMIT)

    async def poll(self, request_id: str) -> PollResult:
        self._require_key(Call.POLL)
        response = await self._send(Call.POLL, "GET", f"/{request_id}/status", params={"logs": "1"})
        if response.status_code == 404:
            return Failed("REQUEST_UNKNOWN", "fal has no such request", retryable=True)
        if response.status_code not in (200, 202):
            raise self._refusal(response, Call.POLL)
        status = json_or_none(response)
        if not isinstance(status, dict):
            raise unexpected_body(Call.POLL, "is not a status")
        state = status.get("status")
        if state == "IN_QUEUE":
            return Running(0)
        if state == "IN_PROGRESS":
            return Running(_progress(status.get("logs")) or 0)
        if state == "COMPLETED":
            if status.get("error") or status.get("error_type"):
                types, message = _error_types(status)
                return failure_of(types, message, server_error=False)
            return await self._result(request_id)
        raise unexpected_body(Call.POLL, f"has an unknown status {short(state)!r}")

    async def _result(self, request_id: str) -> PollResult:
        response = await self._send(Call.RESULT, "GET", f"/{request_id}")
        status = response.status_code
        if status == 200:
            urls = _image_urls(json_or_none(response))
            fetched = await self._outputs.fetch_all(urls)
            return fetched if isinstance(fetched, Failed) else Done(fetched)
        if status in (404, 410):
            # The request completed, and its result is gone: fal keeps payloads for a
            # while only.
            return Failed("OUTPUT_EXPIRED", f"fal's result answered HTTP {status}", False)
        body = json_or_none(response)
        types, message = _error_types(body, response.headers)
        if status == 400 and not types and "cancel" in message.lower():
            return Failed("CANCELLED", message, retryable=False)
        if status in (400, 422) or (status >= 500 and (types or message)):
            # The stored result of a failed generation; fal's own retry verdict, when it
            # gives one, outweighs our reading of the error types.
            failed = failure_of(types, message, server_error=status >= 500)
            verdict = response.headers.get("x-fal-retryable", "").lower()
            if verdict == "false" and failed.retryable:
                return Failed("INTERNAL", failed.message, retryable=False)
            if verdict == "true" and not failed.retryable and failed.code == "INVALID_INPUT":
                return Failed("TRANSIENT", failed.message, retryable=True)
            return failed
        raise status_error(response, Call.RESULT, message)

    async def cancel(self, request_id: str) -> None:
        self._require_key(Call.CANCEL)
        response = await self._send(Call.CANCEL, "PUT", f"/{request_id}/cancel")
        # 202 CANCELLATION_REQUESTED; 400 ALREADY_COMPLETED and 404 leave nothing to stop.
        if response.status_code in (200, 202, 400, 404):
            return
        raise self._refusal(response, Call.CANCEL)

    def _refusal(self, response: httpx.Response, call: Call) -> ProviderError:
        status = response.status_code
        types, message = _error_types(json_or_none(response), response.headers)
        if status in (400, 404, 413, 422):
            failed = failure_of(types, message or f"HTTP {status}", server_error=False)
            if status == 404 and not types:
                return ProviderError(
                    "INVALID_INPUT", f"{call.value}: no such model", retryable=False
                )
            return ProviderError(failed.code, f"{call.value}: {failed.message}", retryable=False)
        return status_error(response, call, message)


def _progress(logs: object) -> int | None:
    if not isinstance(logs, list):
        return None
    text = "\n".join(str(entry.get("message", "")) for entry in logs if isinstance(entry, dict))
    return progress_from_logs(text)

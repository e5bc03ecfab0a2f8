"""Replicate's predictions API behind the two-phase interface.

The catalog's ``provider_model`` picks the route (see hosted/models.py for the options):

- ``owner/name`` — an official model: ``POST /v1/models/{owner}/{name}/predictions``;
- ``owner/name:<version id>`` or a bare 64-hex ``<version id>`` — a pinned version:
  ``POST /v1/predictions`` with ``{"version": "<version id>"}``.

``poll`` reads ``GET /v1/predictions/{id}``: ``starting`` and ``processing`` are Running
(progress is the last percentage in ``logs``), ``succeeded`` downloads ``output``,
``failed`` maps ``error``, ``canceled`` is CANCELLED. ``cancel`` posts
``/v1/predictions/{id}/cancel``.

Replicate takes no idempotency key and no client reference on create, so a create whose
answer was lost cannot be found by us: it is an unknown outcome (NEEDS_ATTENTION). The
attempt's ``submit_outcome_unknown`` warning carries the job id and the submit's start
(``submit_started_at``), which an operator matches against the account's prediction list
(``GET /v1/predictions``, newest first).
"""

from __future__ import annotations

import re

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

CODE = "replicate"
_VERSION_ID = re.compile(r"^[0-9a-f]{64}$")
_OWNER_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# Words of a failed prediction's error that say the output was refused by a safety check.
_CONTENT = ("nsfw", "sensitive", "safety", "content policy", "flagged")
# ...and words that say another try may pass.
_TRANSIENT = ("timed out", "timeout", "out of memory", "try again later", "temporar", "E6716")


def create_route(model: str) -> tuple[str, dict[str, str]]:
    """The create path and the body's routing fields for a provider_model route."""
    if _VERSION_ID.match(model):
        return "/v1/predictions", {"version": model}
    owner_name, colon, version = model.partition(":")
    if not _OWNER_NAME.match(owner_name):
        raise BadModel(f"not a Replicate model: {model!r}")
    if colon:
        if not _VERSION_ID.match(version):
            raise BadModel(f"not a Replicate version id: {version!r}")
        return "/v1/predictions", {"version": version}
    owner, name = owner_name.split("/")
    return f"/v1/models/{owner}/{name}/predictions", {}


def failure_of(error: object) -> Failed:
    """A failed prediction's ``error`` text on the failure table."""
    text = short(error or "the prediction failed")
    lowered = text.lower()
    if any(word in lowered for word in _CONTENT):
        return Failed("CONTENT_REJECTED", text, retryable=False)
    if any(word.lower() in lowered for word in _TRANSIENT):
        return Failed("TRANSIENT", text, retryable=True)
    return Failed("INTERNAL", text, retryable=False)


def _detail(response: httpx.Response) -> str:
    body = json_or_none(response)
    if isinstance(body, dict):
        return short(body.get("detail") or body.get("title") or "")
    return ""


def _output_urls(output: object) -> list[str]:
    items = output if isinstance(output, list) else [output]
    return [item for item in items if isinstance(item, str) and item]


class ReplicateProvider(HostedAdapter):
    code = CODE
    version = "replicate-predictions-v1"
    supports_idempotent_submit = False
    key_setting = "ATELIER_REPLICATE_API_TOKEN"
    auth_scheme = "Bearer"
    # No RequestLookup: a prediction carries no client reference, and the list of
    # predictions filters by source and time only (the module's docstring).
    lookup_note = (
        "Replicate keeps no client reference on a prediction, so it cannot be found by job"
        " id: match the job's submit_outcome_unknown log line (job id, submit_started_at)"
        " against the account's predictions (GET /v1/predictions, newest first), then adopt"
        " the prediction id"
    )

    @staticmethod
    def vendor_of(settings: ProviderSettings) -> VendorSettings:
        return settings.replicate

    async def submit(self, request: GenerationRequest, idempotency_key: str) -> str:
        self._require_key(Call.SUBMIT)
        try:
            model, options = split_model(request.provider_model, image_field="image", size="wh")
            path, routing = create_route(model)
        except BadModel as error:
            raise ProviderError("INVALID_INPUT", str(error), retryable=False) from None
        body = {**routing, "input": model_input(request, options, "num_outputs")}
        response = await self._send(Call.SUBMIT, "POST", path, json=body)
        if response.status_code in (200, 201, 202):
            prediction = json_or_none(response)
            if isinstance(prediction, dict) and isinstance(prediction.get("id"), str):
                return str(prediction["id"])
            raise unexpected_body(Call.SUBMIT, "has no prediction id")
        raise self._refusal(response, Call.SUBMIT)

    async def poll(self, request_id: str) -> PollResult:
        self._require_key(Call.POLL)
        response = await self._send(Call.POLL, "GET", f"/v1/predictions/{request_id}")
        if response.status_code == 404:
            return Failed("REQUEST_UNKNOWN", "Replicate has no such prediction", retryable=True)
        if response.status_code != 200:
            raise self._refusal(response, Call.POLL)
        prediction = json_or_none(response)
        if not isinstance(prediction, dict):
            raise unexpected_body(Call.POLL, "is not a prediction")
        status = prediction.get("status")
        if status in ("starting", "processing"):
            logs = prediction.get("logs")
            progress = progress_from_logs(logs) if isinstance(logs, str) else None
            return Running(progress or 0)
        if status == "succeeded":
            if prediction.get("data_removed"):
                return Failed("OUTPUT_EXPIRED", "Replicate removed the output", retryable=False)
            urls = _output_urls(prediction.get("output"))
            fetched = await self._outputs.fetch_all(urls)
            return fetched if isinstance(fetched, Failed) else Done(fetched)
        if status == "failed":
            return failure_of(prediction.get("error"))
        if status == "canceled":
            return Failed("CANCELLED", "the prediction was canceled", retryable=False)
        if status == "aborted":
            # Stopped before it started (a deadline, an outage): nothing ran.
            return Failed("TRANSIENT", "the prediction was aborted", retryable=True)
        raise unexpected_body(Call.POLL, f"has an unknown status {short(status)!r}")

    async def cancel(self, request_id: str) -> None:
        self._require_key(Call.CANCEL)
        response = await self._send(Call.CANCEL, "POST", f"/v1/predictions/{request_id}/cancel")
        if response.status_code in (200, 202, 204, 404):
            return  # cancelled, or nothing to cancel
        raise self._refusal(response, Call.CANCEL)

    def _refusal(self, response: httpx.Response, call: Call) -> ProviderError:
        detail = _detail(response)
        status = response.status_code
        if status in (400, 404, 409, 413, 422):
            if any(word in detail.lower() for word in _CONTENT):
                return ProviderError("CONTENT_REJECTED", detail, retryable=False)
            what = "no such model or version" if status == 404 else "refused the input"
            return ProviderError(
                "INVALID_INPUT",
                f"{call.value}: HTTP {status} {what}: {detail}",
                retryable=False,
            )
        return status_error(response, call, detail)

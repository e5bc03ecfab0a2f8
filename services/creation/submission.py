"""A SubmitJob request, checked and reduced to what the store needs, and the canonical
hash that makes idempotent submission exact."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.creation.catalog import CatalogModel
from services.creation.domain import MAX_OUTPUTS, MIN_OUTPUTS
from services.creation.errors import InvalidRequest, Reason
from services.creation.parameters import (
    Parameters,
    Scalar,
    check_parameters,
    check_shape,
    check_size,
)
from services.kit import idempotency
from services.kit.errors import FieldViolation
from services.kit.ids import is_uuid

MAX_PROMPT, MAX_NEGATIVE_PROMPT = 2000, 1000
MAX_INPUT_URL = 2048
# SubmitJob's request_id / Idempotency-Key rule is every service's.
choose_idempotency_key = idempotency.choose_key

CATALOG_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Control characters other than tab and newlines; PostgreSQL text cannot even hold NUL.
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class JobWebhook:
    """SubmitJob's per-job webhook (a trusted caller's only): where, and which events."""

    url: str
    event_types: tuple[str, ...]


@dataclass(frozen=True)
class SubmitCommand:
    idempotency_key: str | None
    model_id: str
    style_id: str
    # The input photo (None: made from the prompt alone, or input_url's import).
    input_asset_id: str | None
    prompt: str
    negative_prompt: str
    width: int
    height: int
    parameters: Parameters
    num_outputs: int = 1
    # The photo by address: media imports it before the job is made (input_asset_id is
    # then the imported asset's id, which the request hash leaves out).
    input_url: str | None = None
    # A per-job webhook, checked as permitted and well formed.
    webhook: JobWebhook | None = None

    def request_hash(self) -> str:
        """SHA-256 of the canonical request: every field but the idempotency key, as JSON
        with sorted keys, so equal requests hash equal however they were spelled. One
        output is left out, so requests made before outputs were a list hash as they did."""
        canonical: dict[str, Any] = {
            "model_id": self.model_id,
            "style_id": self.style_id,
            "input_asset_id": self.input_asset_id,
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "width": self.width,
            "height": self.height,
            # The values by name: {"seed": 7} hashes as it did when parameters were a
            # free-form object and then a message.
            "parameters": dict(self.parameters),
        }
        if self.num_outputs != 1:
            canonical["num_outputs"] = self.num_outputs
        if self.input_url is not None:
            # The URL is the request; the asset its import made is not.
            canonical["input_asset_id"] = None
            canonical["input_url"] = self.input_url
        if self.webhook is not None:
            # Only when given: requests without one hash as they always did.
            canonical["webhook"] = {
                "url": self.webhook.url,
                "event_types": list(self.webhook.event_types),
            }
        encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(encoded.encode()).hexdigest()


# The media kinds a worker generates: a model of any other kind (video, in the contract
# and the catalog) is refused at submit rather than queued for a job nothing can run.
GENERATED_KINDS = frozenset({"image"})


def refuse_ungenerated_kind(model: CatalogModel | None) -> None:
    """Raises when ``model`` makes a media kind no worker generates."""
    if model is not None and model.media_kind not in GENERATED_KINDS:
        raise InvalidRequest(
            Reason.MEDIA_KIND_NOT_SUPPORTED,
            "model_id",
            f"model {model.model_id!r} makes {model.media_kind}; only image models run jobs",
        )


def check_input_image(model: CatalogModel | None, command: SubmitCommand) -> None:
    """Raises when the request's photo (or its absence) does not suit ``model``'s
    input_image; None (no such model) is left to the submit's own verdict."""
    if model is None:
        return
    given = "input_url" if command.input_url is not None else "input_asset_id"
    has_input = command.input_url is not None or command.input_asset_id is not None
    if model.input_image == "required" and not has_input:
        raise InvalidRequest(
            Reason.INPUT_IMAGE_REQUIRED,
            "input_asset_id",
            f"model {model.model_id!r} restyles a photo: send input_asset_id or input_url",
        )
    if model.input_image == "refused" and has_input:
        raise InvalidRequest(
            Reason.INPUT_IMAGE_REFUSED,
            given,
            f"model {model.model_id!r} makes pictures from the prompt alone: send no photo",
        )


def is_catalog_id(value: str) -> bool:
    return CATALOG_ID.match(value) is not None


def has_control_characters(value: str) -> bool:
    return CONTROL.search(value) is not None


def _check_text(name: str, value: str, limit: int, problems: list[FieldViolation]) -> None:
    if len(value) > limit:
        problems.append(FieldViolation(name, f"must be at most {limit} characters"))
    if has_control_characters(value):
        problems.append(FieldViolation(name, "must not contain control characters"))


def _check_side(name: str, value: int, problems: list[FieldViolation]) -> None:
    # The model's size range (the catalog's) is checked once the model is known.
    if value == 0:
        problems.append(FieldViolation(name, "is required (pixels)"))
    elif value < 0:
        problems.append(FieldViolation(name, "must be a positive number of pixels"))


def validate(
    *,
    idempotency_key: str | None,
    model_id: str,
    style_id: str,
    input_asset_id: str,
    prompt: str,
    negative_prompt: str,
    width: int,
    height: int,
    parameters: Mapping[str, Scalar | None],
    num_outputs: int = 0,
    model: CatalogModel | None = None,
    input_url: str = "",
) -> tuple[SubmitCommand | None, list[FieldViolation]]:
    """The command, or every problem at once. ``model`` is the enabled catalog model
    ``model_id`` names, whose sizes and parameter schema the request must fit; None when
    there is none (the submit then answers MODEL_NOT_AVAILABLE, or replays)."""
    problems: list[FieldViolation] = []
    for name, value in (("model_id", model_id), ("style_id", style_id)):
        if not value:
            problems.append(FieldViolation(name, "is required"))
        elif not CATALOG_ID.match(value):
            problems.append(FieldViolation(name, "is not a catalog id"))
    if input_asset_id and not is_uuid(input_asset_id):
        problems.append(FieldViolation("input_asset_id", "must be a UUID"))
    if input_url:
        # What the URL may name is media's to judge (ImportAsset's guard); only its shape
        # is checked here.
        if input_asset_id:
            problems.append(
                FieldViolation("input_url", "give input_asset_id or input_url, not both")
            )
        if len(input_url) > MAX_INPUT_URL:
            problems.append(
                FieldViolation("input_url", f"must be at most {MAX_INPUT_URL} characters")
            )
        if has_control_characters(input_url) or any(c.isspace() for c in input_url):
            problems.append(
                FieldViolation("input_url", "must not contain spaces or control characters")
            )
    _check_text("prompt", prompt, MAX_PROMPT, problems)
    _check_text("negative_prompt", negative_prompt, MAX_NEGATIVE_PROMPT, problems)
    _check_side("width", width, problems)
    _check_side("height", height, problems)
    problems.extend(check_shape(parameters))
    if model is not None:
        if width > 0 and height > 0:
            problems.extend(check_size(model.size_range, width, height, model.model_id))
        problems.extend(check_parameters(parameters, model.parameter_specs, model.model_id))
    outputs = num_outputs or MIN_OUTPUTS
    if not MIN_OUTPUTS <= outputs <= MAX_OUTPUTS:
        problems.append(
            FieldViolation("num_outputs", f"must be {MIN_OUTPUTS} to {MAX_OUTPUTS} (0 means 1)")
        )
    if problems:
        return None, problems
    return (
        SubmitCommand(
            idempotency_key=idempotency_key,
            model_id=model_id,
            style_id=style_id,
            input_asset_id=input_asset_id.lower() or None,
            prompt=prompt,
            negative_prompt=negative_prompt,
            width=width,
            height=height,
            # check_shape refused a value with nothing set.
            parameters={name: value for name, value in parameters.items() if value is not None},
            num_outputs=outputs,
            input_url=input_url or None,
        ),
        [],
    )

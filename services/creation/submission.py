"""A SubmitJob request, checked and reduced to what the store needs, and the canonical
hash that makes idempotent submission exact."""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

from services.creation.domain import MAX_OUTPUTS, MIN_OUTPUTS
from services.kit import idempotency
from services.kit.errors import FieldViolation

MIN_SIDE, MAX_SIDE, SIDE_MULTIPLE = 64, 2048, 8
MAX_PROMPT, MAX_NEGATIVE_PROMPT = 2000, 1000
MAX_PARAMETERS, MAX_PARAMETER_STRING = 20, 200
# SubmitJob's request_id / Idempotency-Key rule is every service's.
choose_idempotency_key = idempotency.choose_key

_CATALOG_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_PARAMETER_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
# Control characters other than tab and newlines; PostgreSQL text cannot even hold NUL.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class SubmitCommand:
    idempotency_key: str | None
    model_id: str
    style_id: str
    input_asset_id: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    parameters: dict[str, Any]
    num_outputs: int = 1

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
            "parameters": self.parameters,
        }
        if self.num_outputs != 1:
            canonical["num_outputs"] = self.num_outputs
        encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(encoded.encode()).hexdigest()


def is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


def has_control_characters(value: str) -> bool:
    return _CONTROL.search(value) is not None


def _check_text(name: str, value: str, limit: int, problems: list[FieldViolation]) -> None:
    if len(value) > limit:
        problems.append(FieldViolation(name, f"must be at most {limit} characters"))
    if has_control_characters(value):
        problems.append(FieldViolation(name, "must not contain control characters"))


def _check_side(name: str, value: int, problems: list[FieldViolation]) -> None:
    if not MIN_SIDE <= value <= MAX_SIDE or value % SIDE_MULTIPLE:
        problems.append(
            FieldViolation(
                name, f"must be a multiple of {SIDE_MULTIPLE} between {MIN_SIDE} and {MAX_SIDE}"
            )
        )


def _check_parameters(parameters: dict[str, Any], problems: list[FieldViolation]) -> None:
    if len(parameters) > MAX_PARAMETERS:
        problems.append(FieldViolation("parameters", f"must have at most {MAX_PARAMETERS} keys"))
    for name, value in parameters.items():
        field = f"parameters.{name}"
        if not _PARAMETER_NAME.match(name):
            problems.append(FieldViolation(field, "names are lowercase letters, digits and _"))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int | float):
            if not math.isfinite(value):
                problems.append(FieldViolation(field, "must be a finite number"))
        elif isinstance(value, str):
            _check_text(field, value, MAX_PARAMETER_STRING, problems)
        else:
            problems.append(FieldViolation(field, "must be a string, number or boolean"))


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
    parameters: dict[str, Any],
    num_outputs: int = 0,
) -> tuple[SubmitCommand | None, list[FieldViolation]]:
    problems: list[FieldViolation] = []
    for name, value in (("model_id", model_id), ("style_id", style_id)):
        if not value:
            problems.append(FieldViolation(name, "is required"))
        elif not _CATALOG_ID.match(value):
            problems.append(FieldViolation(name, "is not a catalog id"))
    if not input_asset_id:
        problems.append(FieldViolation("input_asset_id", "is required"))
    elif not is_uuid(input_asset_id):
        problems.append(FieldViolation("input_asset_id", "must be a UUID"))
    _check_text("prompt", prompt, MAX_PROMPT, problems)
    _check_text("negative_prompt", negative_prompt, MAX_NEGATIVE_PROMPT, problems)
    _check_side("width", width, problems)
    _check_side("height", height, problems)
    _check_parameters(parameters, problems)
    outputs = num_outputs or MIN_OUTPUTS
    if not MIN_OUTPUTS <= outputs <= MAX_OUTPUTS:
        problems.append(
            FieldViolation("num_outputs", f"must be {MIN_OUTPUTS} to {MAX_OUTPUTS} (0 means 1)")
        )
    if problems:
        return None, problems
    # Whole numbers are stored as ints so 7 and 7.0 hash the same.
    normal = {
        k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in parameters.items()
    }
    return (
        SubmitCommand(
            idempotency_key=idempotency_key,
            model_id=model_id,
            style_id=style_id,
            input_asset_id=input_asset_id.lower(),
            prompt=prompt,
            negative_prompt=negative_prompt,
            width=width,
            height=height,
            parameters=normal,
            num_outputs=outputs,
        ),
        [],
    )

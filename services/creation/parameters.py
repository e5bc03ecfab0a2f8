"""A job's typed generation parameters, a model's schema for them (the catalog's
parameter specs and size range), and the check of one against the other. Pure: the
catalog store reads the schema, SubmitJob checks against it, providers map the values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from services.kit.errors import FieldViolation

# The request field the violations name (SubmitJobRequest.generation_parameters).
FIELD = "generation_parameters"


@dataclass(frozen=True)
class GenerationParameters:
    """What a job asks of its model; None means the model's default."""

    seed: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    strength: float | None = None

    def as_dict(self) -> dict[str, int | float]:
        """The set parameters by name: what the job row stores and the request hash reads."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> GenerationParameters:
        """The parameters of a stored job. Rows written before parameters were typed may
        hold other names or types: those are not parameters any provider receives."""
        kept: dict[str, Any] = {}
        for name, kind in TYPES.items():
            value = stored.get(name)
            if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
                kept[name] = value
            elif kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
                kept[name] = float(value)
        return cls(**kept)


# Each parameter's type, as a ParameterSpec states it.
TYPES = {"seed": "int", "steps": "int", "guidance_scale": "float", "strength": "float"}
SPEC_TYPES = ("int", "float", "bool", "string", "enum")

Scalar = int | float | bool | str


@dataclass(frozen=True)
class ParameterSpec:
    """What a model accepts for one parameter (bounds inclusive)."""

    name: str
    type: str
    description: str = ""
    min: int | float | None = None
    max: int | float | None = None
    default: Scalar | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SizeRange:
    min_width: int
    max_width: int
    min_height: int
    max_height: int
    multiple_of: int


class BadSpec(ValueError):
    """A catalog row's parameter spec cannot be read."""


def _number(raw: Any, what: str) -> int | float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise BadSpec(f"{what} must be a number")
    return raw


def spec_from_json(raw: Any) -> ParameterSpec:
    """A spec as the catalog stores it: {"name", "type", "description", "min", "max",
    "default", "choices"}; the name must be a GenerationParameters field of that type."""
    if not isinstance(raw, dict):
        raise BadSpec("a parameter spec must be an object")
    name, kind = raw.get("name"), raw.get("type")
    if name not in TYPES:
        raise BadSpec(f"{name!r} is not a generation parameter")
    if kind != TYPES[name]:
        raise BadSpec(f"{name} is of type {TYPES[name]}, not {kind!r}")
    default = raw.get("default")
    if default is not None and not isinstance(default, int | float | bool | str):
        raise BadSpec(f"{name}'s default must be a scalar")
    choices = raw.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise BadSpec(f"{name}'s choices must be strings")
    return ParameterSpec(
        name=name,
        type=kind,
        description=str(raw.get("description") or ""),
        min=_number(raw.get("min"), f"{name}'s min"),
        max=_number(raw.get("max"), f"{name}'s max"),
        default=default,
        choices=tuple(choices),
    )


def non_finite(parameters: GenerationParameters) -> list[FieldViolation]:
    """What no model takes: NaN and infinities (JSON cannot even store them)."""
    return [
        FieldViolation(f"{FIELD}.{name}", "must be a finite number")
        for name, value in parameters.as_dict().items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


def _check_value(spec: ParameterSpec, value: int | float, problems: list[FieldViolation]) -> None:
    field = f"{FIELD}.{spec.name}"
    if spec.min is not None and value < spec.min:
        problems.append(FieldViolation(field, f"must be at least {spec.min}"))
    elif spec.max is not None and value > spec.max:
        problems.append(FieldViolation(field, f"must be at most {spec.max}"))


def check_parameters(
    parameters: GenerationParameters, specs: Sequence[ParameterSpec], model_id: str
) -> list[FieldViolation]:
    """One violation per parameter the model does not take or takes in another range."""
    by_name = {spec.name: spec for spec in specs}
    problems: list[FieldViolation] = []
    for name, value in parameters.as_dict().items():
        spec = by_name.get(name)
        if spec is None:
            problems.append(FieldViolation(f"{FIELD}.{name}", f"is not a parameter of {model_id}"))
        elif not (isinstance(value, float) and not math.isfinite(value)):
            _check_value(spec, value, problems)  # non_finite already named the others
    return problems


def check_size(size: SizeRange, width: int, height: int, model_id: str) -> list[FieldViolation]:
    problems: list[FieldViolation] = []
    for name, value, low, high in (
        ("width", width, size.min_width, size.max_width),
        ("height", height, size.min_height, size.max_height),
    ):
        if not low <= value <= high or value % size.multiple_of:
            problems.append(
                FieldViolation(
                    name,
                    f"must be a multiple of {size.multiple_of} between {low} and {high}"
                    f" for {model_id}",
                )
            )
    return problems

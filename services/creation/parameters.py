"""A job's generation parameters (named, typed values), a model's schema for them (the
catalog's parameter specs and size range), and the check of one against the other. Pure:
the catalog store reads the schema, SubmitJob checks against it, providers map the values.

A new model setting is catalog data: a spec names it and types it, and SubmitJob then
takes it; no contract change. Values are Python's own types, kept apart exactly as the
contract's ParameterValue keeps them (``bool`` is never an ``int`` here)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.kit.errors import FieldViolation

# The request field the violations name (SubmitJobRequest.parameters).
FIELD = "parameters"
# A parameter's name: what a spec may declare and a request may send.
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_PARAMETERS = 64
MAX_STRING = 1000

Scalar = int | float | bool | str
# A job's parameters by name.
Parameters = Mapping[str, Scalar]

SPEC_TYPES = ("int", "float", "bool", "string", "enum")
# How each value is stored (jobs.parameters, the outbox payload): the contract's own JSON
# of a ParameterValue, so the payload's builder copies it as it is.
_TAGS = {"int": "intValue", "float": "floatValue", "bool": "boolValue", "string": "stringValue"}


def value_kind(value: Scalar) -> str:
    """Which ParameterValue field holds ``value``: int, float, bool or string."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"


def to_stored(parameters: Parameters) -> dict[str, dict[str, Any]]:
    """The parameters as jobs.parameters holds them: {"seed": {"intValue": "42"}} (an
    int64 is a string in protobuf's JSON, so it stays exact everywhere)."""
    stored: dict[str, dict[str, Any]] = {}
    for name, value in parameters.items():
        kind = value_kind(value)
        stored[name] = {_TAGS[kind]: str(value) if kind == "int" else value}
    return stored


def from_stored(stored: Mapping[str, Any]) -> dict[str, Scalar]:
    """A stored job's parameters; an entry of no known form is not a parameter any
    provider receives (and was never accepted by SubmitJob)."""
    values: dict[str, Scalar] = {}
    for name, entry in stored.items():
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        [(tag, raw)] = entry.items()
        if tag == "intValue" and isinstance(raw, str | int) and not isinstance(raw, bool):
            try:
                values[name] = int(raw)
            except ValueError:
                continue
        elif tag == "floatValue" and isinstance(raw, int | float) and not isinstance(raw, bool):
            values[name] = float(raw)
        elif (tag, type(raw)) in (("boolValue", bool), ("stringValue", str)):
            values[name] = raw
    return values


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


def _number(raw: Any, kind: str, what: str) -> int | float | None:
    if raw is None:
        return None
    if kind == "int" and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise BadSpec(f"{what} must be a whole number")
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise BadSpec(f"{what} must be a number")
    return raw


def _default_fits(kind: str, default: Any) -> bool:
    if default is None:
        return True
    if kind == "bool":
        return isinstance(default, bool)
    if kind in ("string", "enum"):
        return isinstance(default, str)
    if isinstance(default, bool):
        return False
    return isinstance(default, int) if kind == "int" else isinstance(default, int | float)


def spec_from_json(raw: Any) -> ParameterSpec:
    """A spec as the catalog stores it: {"name", "type", "description", "min", "max",
    "default", "choices"}. Any name of lower-case letters, digits and underscores; bounds
    for numbers only; an enum lists its choices."""
    if not isinstance(raw, dict):
        raise BadSpec("a parameter spec must be an object")
    name, kind = raw.get("name"), raw.get("type")
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadSpec(f"{name!r} is not a parameter name (a-z, 0-9, _; up to 64)")
    if kind not in SPEC_TYPES:
        raise BadSpec(f"{name}'s type must be one of {', '.join(SPEC_TYPES)}, not {kind!r}")
    numeric = kind in ("int", "float")
    if not numeric and (raw.get("min") is not None or raw.get("max") is not None):
        raise BadSpec(f"{name} is of type {kind}: it takes no min or max")
    default = raw.get("default")
    if not _default_fits(kind, default):
        raise BadSpec(f"{name}'s default is not of type {kind}")
    choices = raw.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise BadSpec(f"{name}'s choices must be strings")
    if (kind == "enum") != bool(choices):
        raise BadSpec(f"{name}: an enum lists its choices, and only an enum has them")
    if kind == "enum" and default is not None and default not in choices:
        raise BadSpec(f"{name}'s default is not one of its choices")
    return ParameterSpec(
        name=name,
        type=kind,
        description=str(raw.get("description") or ""),
        min=_number(raw.get("min"), kind, f"{name}'s min") if numeric else None,
        max=_number(raw.get("max"), kind, f"{name}'s max") if numeric else None,
        default=default,
        choices=tuple(choices),
    )


# The ParameterValue field a value of each spec type is sent in.
VALUE_FIELDS = {
    "int": "int_value",
    "float": "float_value",
    "bool": "bool_value",
    "string": "string_value",
    "enum": "string_value",
}


def check_shape(parameters: Mapping[str, Scalar | None]) -> list[FieldViolation]:
    """What no model takes, whatever its specs: too many parameters, a name that no spec
    could declare, a value with nothing set (None), a non-finite number, an over-long
    string."""
    problems: list[FieldViolation] = []
    if len(parameters) > MAX_PARAMETERS:
        problems.append(FieldViolation(FIELD, f"must hold at most {MAX_PARAMETERS} parameters"))
    for name, value in parameters.items():
        if not _NAME.match(name):
            problems.append(
                FieldViolation(FIELD, f"{name[:64]!r} is not a parameter name (a-z, 0-9, _)")
            )
        elif value is None:
            problems.append(
                FieldViolation(
                    f"{FIELD}.{name}",
                    "must hold a value (int_value, float_value, bool_value or string_value)",
                )
            )
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(FieldViolation(f"{FIELD}.{name}", "must be a finite number"))
        elif isinstance(value, str) and len(value) > MAX_STRING:
            problems.append(
                FieldViolation(f"{FIELD}.{name}", f"must be at most {MAX_STRING} characters")
            )
    return problems


def _check_value(spec: ParameterSpec, value: Scalar, problems: list[FieldViolation]) -> None:
    field = f"{FIELD}.{spec.name}"
    expected = spec.type if spec.type != "enum" else "string"
    if value_kind(value) != expected:
        problems.append(
            FieldViolation(field, f"must be a {spec.type} (send {VALUE_FIELDS[spec.type]})")
        )
    elif spec.type == "enum" and value not in spec.choices:
        problems.append(FieldViolation(field, f"must be one of {', '.join(spec.choices)}"))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if spec.min is not None and value < spec.min:
            problems.append(FieldViolation(field, f"must be at least {spec.min}"))
        elif spec.max is not None and value > spec.max:
            problems.append(FieldViolation(field, f"must be at most {spec.max}"))


def check_parameters(
    parameters: Mapping[str, Scalar | None], specs: Sequence[ParameterSpec], model_id: str
) -> list[FieldViolation]:
    """One violation per parameter the model does not take, or takes of another type, in
    another range or from other choices. Shapes check_shape refuses are left to it."""
    by_name = {spec.name: spec for spec in specs}
    problems: list[FieldViolation] = []
    for name, value in parameters.items():
        if value is None or not _NAME.match(name):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        spec = by_name.get(name)
        if spec is None:
            problems.append(FieldViolation(f"{FIELD}.{name}", f"is not a parameter of {model_id}"))
        else:
            _check_value(spec, value, problems)
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

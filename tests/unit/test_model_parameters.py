"""A model's schema against a job's parameters and size: each bad parameter named once
(unknown, of another type, out of range, not a choice), bounds inclusive, a seed checked
as an exact integer; the specs as the catalog stores them; parameters as jobs store them."""

from __future__ import annotations

import pytest

from services.creation.parameters import (
    MAX_PARAMETERS,
    MAX_STRING,
    BadSpec,
    ParameterSpec,
    Scalar,
    SizeRange,
    check_parameters,
    check_shape,
    check_size,
    from_stored,
    spec_from_json,
    to_stored,
)

INT64_MAX = 2**63 - 1
SPECS = (
    ParameterSpec("seed", "int", min=0, max=INT64_MAX - 1),
    ParameterSpec("steps", "int", min=1, max=50, default=28),
    ParameterSpec("guidance_scale", "float", min=1.0, max=20.0),
    ParameterSpec("safety_check", "bool", default=True),
    ParameterSpec("caption", "string"),
    ParameterSpec("sampler", "enum", choices=("euler", "ddim"), default="euler"),
)
SIZES = SizeRange(min_width=256, max_width=1024, min_height=128, max_height=768, multiple_of=16)


def fields(parameters: dict[str, Scalar | None]) -> list[str]:
    return [p.field for p in check_parameters(parameters, SPECS, "m")]


def test_values_of_each_type_on_the_bounds_pass() -> None:
    assert fields({"seed": 0, "steps": 50, "guidance_scale": 1.0}) == []
    assert fields({"seed": INT64_MAX - 1, "steps": 1, "guidance_scale": 20.0}) == []
    assert fields({"safety_check": False, "caption": "a cat", "sampler": "ddim"}) == []
    assert fields({}) == []


@pytest.mark.parametrize(
    ("parameters", "field", "says"),
    [
        ({"steps": 51}, "parameters.steps", "at most 50"),
        ({"steps": 0}, "parameters.steps", "at least 1"),
        ({"guidance_scale": 0.5}, "parameters.guidance_scale", "1.0"),
        # One past a bound a double would round onto: compared as integers.
        ({"seed": INT64_MAX}, "parameters.seed", "at most"),
        ({"seed": -1}, "parameters.seed", "at least 0"),
        ({"strength": 0.5}, "parameters.strength", "not a parameter of m"),
        # Ill-typed: each value must come in its spec's ParameterValue field.
        ({"steps": 30.0}, "parameters.steps", "must be a int (send int_value)"),
        ({"steps": True}, "parameters.steps", "send int_value"),
        ({"guidance_scale": 7}, "parameters.guidance_scale", "send float_value"),
        ({"safety_check": 1}, "parameters.safety_check", "send bool_value"),
        ({"caption": False}, "parameters.caption", "send string_value"),
        ({"sampler": 2}, "parameters.sampler", "send string_value"),
        ({"sampler": "karras"}, "parameters.sampler", "one of euler, ddim"),
    ],
)
def test_each_bad_parameter_is_named(
    parameters: dict[str, Scalar | None], field: str, says: str
) -> None:
    [problem] = check_parameters(parameters, SPECS, "m")
    assert problem.field == field and says in problem.description


def test_every_bad_parameter_at_once() -> None:
    got = fields({"seed": -1, "steps": 99, "strength": 0.3, "sampler": "x"})
    assert got == [
        "parameters.seed",
        "parameters.steps",
        "parameters.strength",
        "parameters.sampler",
    ]


@pytest.mark.parametrize(
    ("parameters", "field", "says"),
    [
        ({"steps": None}, "parameters.steps", "must hold a value"),
        ({"guidance_scale": float("nan")}, "parameters.guidance_scale", "finite"),
        ({"guidance_scale": float("-inf")}, "parameters.guidance_scale", "finite"),
        ({"caption": "x" * (MAX_STRING + 1)}, "parameters.caption", f"at most {MAX_STRING}"),
        ({"Steps": 1}, "parameters", "not a parameter name"),
        ({"": 1}, "parameters", "not a parameter name"),
        ({"a.b": 1}, "parameters", "not a parameter name"),
    ],
)
def test_what_no_model_takes_is_named_before_the_specs(
    parameters: dict[str, Scalar | None], field: str, says: str
) -> None:
    [problem] = check_shape(parameters)
    assert problem.field == field and says in problem.description
    # The specs' check leaves these to the shape's, so each is named once.
    assert check_parameters(parameters, SPECS, "m") == []


def test_too_many_parameters_is_one_violation() -> None:
    many: dict[str, Scalar | None] = {f"p{i}": i for i in range(MAX_PARAMETERS + 1)}
    assert [p.field for p in check_shape(many)] == ["parameters"]
    assert check_shape(dict(list(many.items())[:MAX_PARAMETERS])) == []


@pytest.mark.parametrize(
    ("width", "height", "bad"),
    [
        (256, 128, []),
        (1024, 768, []),
        (240, 128, ["width"]),
        (1040, 128, ["width"]),
        (264, 128, ["width"]),  # in range, not a multiple of 16
        (512, 784, ["height"]),
        (8, 8, ["width", "height"]),
    ],
)
def test_the_size_range(width: int, height: int, bad: list[str]) -> None:
    assert [p.field for p in check_size(SIZES, width, height, "m")] == bad


def test_stored_specs_read_back_exactly_whatever_their_name() -> None:
    spec = spec_from_json(
        {"name": "seed", "type": "int", "min": 0, "max": INT64_MAX, "description": "d"}
    )
    assert spec == ParameterSpec("seed", "int", "d", 0, INT64_MAX)
    # A new setting is catalog data: any name, any of the five types.
    enum = spec_from_json(
        {"name": "sampler", "type": "enum", "choices": ["euler", "ddim"], "default": "ddim"}
    )
    assert enum == ParameterSpec("sampler", "enum", default="ddim", choices=("euler", "ddim"))
    assert spec_from_json({"name": "hdr", "type": "bool", "default": False}).default is False


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "Sampler", "type": "string"},  # not a parameter name
        {"name": "seed", "type": "integer"},  # not a type
        {"name": "steps", "type": "int", "min": "1"},
        {"name": "steps", "type": "int", "max": 2.5},  # an int's bound is whole
        {"name": "steps", "type": "int", "default": [1]},
        {"name": "steps", "type": "int", "default": True},
        {"name": "hdr", "type": "bool", "min": 0},  # bounds are for numbers
        {"name": "sampler", "type": "enum"},  # an enum lists its choices
        {"name": "sampler", "type": "string", "choices": ["a"]},
        {"name": "sampler", "type": "enum", "choices": ["a"], "default": "b"},
        ["seed"],
    ],
)
def test_an_unreadable_spec_is_refused(raw: object) -> None:
    with pytest.raises(BadSpec):
        spec_from_json(raw)


def test_parameters_are_stored_as_the_contracts_json_and_read_back_exactly() -> None:
    values: dict[str, Scalar] = {
        "seed": INT64_MAX,
        "guidance_scale": 7.0,
        "safety_check": False,
        "sampler": "ddim",
    }
    stored = to_stored(values)
    assert stored == {
        "seed": {"intValue": str(INT64_MAX)},
        "guidance_scale": {"floatValue": 7.0},
        "safety_check": {"boolValue": False},
        "sampler": {"stringValue": "ddim"},
    }
    back = from_stored(stored)
    assert back == values
    assert type(back["guidance_scale"]) is float and type(back["safety_check"]) is bool


def test_stored_entries_of_no_known_form_are_not_parameters() -> None:
    stored = {
        "a": 3,
        "b": {"intValue": "x"},
        "c": {"boolValue": "yes"},
        "d": {"floatValue": True},
        "e": {"intValue": "1", "floatValue": 1.0},
        "f": {"floatValue": 2},
    }
    assert from_stored(stored) == {"f": 2.0}

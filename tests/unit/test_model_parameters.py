"""A model's schema against a job's parameters and size: each bad parameter named once,
bounds inclusive, a seed checked as an exact integer; and the specs as the catalog stores
them."""

from __future__ import annotations

import pytest

from services.creation.parameters import (
    BadSpec,
    GenerationParameters,
    ParameterSpec,
    SizeRange,
    check_parameters,
    check_size,
    spec_from_json,
)

INT64_MAX = 2**63 - 1
SPECS = (
    ParameterSpec("seed", "int", min=0, max=INT64_MAX - 1),
    ParameterSpec("steps", "int", min=1, max=50, default=28),
    ParameterSpec("guidance_scale", "float", min=1.0, max=20.0),
)
SIZES = SizeRange(min_width=256, max_width=1024, min_height=128, max_height=768, multiple_of=16)


def fields(parameters: GenerationParameters) -> list[str]:
    return [p.field for p in check_parameters(parameters, SPECS, "m")]


def test_values_on_the_bounds_pass() -> None:
    assert fields(GenerationParameters(seed=0, steps=50, guidance_scale=1.0)) == []
    assert fields(GenerationParameters(seed=INT64_MAX - 1, steps=1, guidance_scale=20.0)) == []
    assert fields(GenerationParameters()) == []


@pytest.mark.parametrize(
    ("parameters", "field", "says"),
    [
        (GenerationParameters(steps=51), "generation_parameters.steps", "at most 50"),
        (GenerationParameters(steps=0), "generation_parameters.steps", "at least 1"),
        (GenerationParameters(guidance_scale=0.5), "generation_parameters.guidance_scale", "1.0"),
        # One past a bound a double would round onto: compared as integers.
        (GenerationParameters(seed=INT64_MAX), "generation_parameters.seed", "at most"),
        (GenerationParameters(seed=-1), "generation_parameters.seed", "at least 0"),
        (GenerationParameters(strength=0.5), "generation_parameters.strength", "not a parameter"),
    ],
)
def test_each_bad_parameter_is_named(
    parameters: GenerationParameters, field: str, says: str
) -> None:
    [problem] = check_parameters(parameters, SPECS, "m")
    assert problem.field == field and says in problem.description


def test_every_bad_parameter_at_once() -> None:
    got = fields(GenerationParameters(seed=-1, steps=99, strength=0.3))
    assert got == [
        "generation_parameters.seed",
        "generation_parameters.steps",
        "generation_parameters.strength",
    ]


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


def test_a_stored_spec_reads_back_exactly() -> None:
    spec = spec_from_json(
        {"name": "seed", "type": "int", "min": 0, "max": INT64_MAX, "description": "d"}
    )
    assert spec == ParameterSpec("seed", "int", "d", 0, INT64_MAX)


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "sampler", "type": "string"},  # not a GenerationParameters field
        {"name": "seed", "type": "float"},  # not the field's type
        {"name": "steps", "type": "int", "min": "1"},
        {"name": "steps", "type": "int", "default": [1]},
        ["seed"],
    ],
)
def test_an_unreadable_spec_is_refused(raw: object) -> None:
    with pytest.raises(BadSpec):
        spec_from_json(raw)


def test_stored_parameters_keep_only_typed_fields() -> None:
    """Rows from before parameters were typed may hold anything; only the typed fields
    of the right type survive (a whole seed stays an exact int)."""
    stored = {"seed": INT64_MAX, "steps": 2.5, "guidance_scale": 7, "hdr": True, "strength": "x"}
    assert GenerationParameters.from_stored(stored) == GenerationParameters(
        seed=INT64_MAX, guidance_scale=7.0
    )

"""The catalog's ``provider_model`` for a hosted vendor: the vendor's model route, then
optional settings after a ``?``, so one catalog row says everything a call needs:

    stability-ai/sdxl:<version>?image=image&size=wh&pass=seed,strength:prompt_strength

- ``image``: the model's input field that takes the photo (default per vendor);
- ``size``: how width and height are sent: ``wh`` (``width``/``height``), ``image_size``
  (``{"image_size": {"width": .., "height": ..}}``) or ``none``;
- ``pass``: which job parameters (names in the model's parameter specs) reach the model, each as
  ``ours`` or ``ours:vendors_name`` (none by default: a parameter can change what a
  generation costs, so the operator lists the safe ones; the row's parameter_specs,
  which SubmitJob checks, must list the same ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from services.creation.providers.base import GenerationRequest
from services.creation.providers.hosted.images import input_reference

SIZE_STYLES = ("wh", "image_size", "none")


class BadModel(ValueError):
    """The catalog's provider_model cannot be read."""


@dataclass(frozen=True)
class ModelOptions:
    image_field: str
    size: str
    passed: dict[str, str]  # our parameter name -> the vendor's input field


def split_model(provider_model: str, *, image_field: str, size: str) -> tuple[str, ModelOptions]:
    """The vendor's route and the options, with this vendor's defaults."""
    route, _, query = provider_model.strip().partition("?")
    options = parse_qs(query, keep_blank_values=False)
    unknown = set(options) - {"image", "size", "pass"}
    if unknown:
        raise BadModel(f"provider_model has unknown options {sorted(unknown)}")
    chosen_size = options.get("size", [size])[-1]
    if chosen_size not in SIZE_STYLES:
        raise BadModel(f"provider_model size must be one of {', '.join(SIZE_STYLES)}")
    passed: dict[str, str] = {}
    for item in (i for value in options.get("pass", []) for i in value.split(",") if i):
        ours, _, theirs = item.partition(":")
        passed[ours] = theirs or ours
    return route, ModelOptions(
        image_field=options.get("image", [image_field])[-1], size=chosen_size, passed=passed
    )


def model_input(
    request: GenerationRequest, options: ModelOptions, count_field: str
) -> dict[str, Any]:
    """The model's input: the listed job parameters first, then what we set ourselves
    (so no parameter can replace the prompt, the photo or the output count)."""
    body: dict[str, Any] = {
        options.passed[name]: value
        for name, value in request.parameters.items()
        if name in options.passed
    }
    body["prompt"] = request.prompt
    if request.negative_prompt:
        body["negative_prompt"] = request.negative_prompt
    reference = input_reference(request)
    if reference is not None:  # a text-to-image job sends no photo
        body[options.image_field] = reference
    if options.size == "wh":
        body["width"] = request.width
        body["height"] = request.height
    elif options.size == "image_size":
        body["image_size"] = {"width": request.width, "height": request.height}
    if request.num_outputs != 1:
        body[count_field] = request.num_outputs
    return body

"""The catalog as the domain sees it: what a user can pick."""

from __future__ import annotations

from dataclasses import dataclass

from services.creation.parameters import ParameterSpec, SizeRange


@dataclass(frozen=True)
class CatalogModel:
    model_id: str
    display_name: str
    description: str
    media_kind: str
    price_points: int
    sort_order: int
    size_range: SizeRange
    parameter_specs: tuple[ParameterSpec, ...]
    # What the model does with an input image: required, optional or refused.
    input_image: str = "required"


@dataclass(frozen=True)
class CatalogStyle:
    style_id: str
    display_name: str
    description: str
    media_kind: str
    sort_order: int


@dataclass(frozen=True)
class Catalog:
    models: list[CatalogModel]
    styles: list[CatalogStyle]

    def model(self, model_id: str) -> CatalogModel | None:
        return next((m for m in self.models if m.model_id == model_id), None)

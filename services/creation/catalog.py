"""The catalog as the domain sees it: what a user can pick."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogModel:
    model_id: str
    display_name: str
    description: str
    media_kind: str
    price_points: int
    sort_order: int


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

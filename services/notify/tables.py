"""The notify schema as SQLAlchemy Core tables."""

from __future__ import annotations

from sqlalchemy import MetaData

from services.kit.db import NAMING_CONVENTION

SCHEMA = "notify"

metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)

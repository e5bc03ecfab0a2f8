"""The media schema as SQLAlchemy Core tables."""

from __future__ import annotations

from sqlalchemy import MetaData

SCHEMA = "media"

metadata = MetaData(schema=SCHEMA)

"""The notify schema as SQLAlchemy Core tables."""

from __future__ import annotations

from sqlalchemy import MetaData

SCHEMA = "notify"

metadata = MetaData(schema=SCHEMA)

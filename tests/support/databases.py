"""A database of one service's own for a test module: its migrations only, no other
module's rows, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from services.dev import postgres
from services.kit import migrations


@contextmanager
def migrated_database(admin_url: str, service: str) -> Iterator[str]:
    name = f"atelier_{service}_{uuid.uuid4().hex[:12]}"
    url = postgres.ensure_database(admin_url, name)
    try:
        migrations.upgrade(service, url)
        yield url
    finally:
        postgres.drop_database(admin_url, name)

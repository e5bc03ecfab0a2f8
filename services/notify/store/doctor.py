"""The one read `atelier push doctor` makes: the active tokens per environment and bundle
id, on an engine of its own (the doctor runs outside the service)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from services.kit.db import create_engine

REGISTERED = text(
    "SELECT environment, bundle_id, count(*) FROM notify.push_tokens"
    " WHERE status = 'active' GROUP BY environment, bundle_id ORDER BY environment, bundle_id"
)


class TokensUnreadable(Exception):
    """The database could not be read; ``kind`` names the driver's error class only (its
    message could hold the URL's password)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def registered_tokens(database_url: str) -> list[tuple[str, str, int]]:
    """(environment, bundle id, count) of the active tokens, in that order."""
    engine = create_engine(database_url, application_name="atelier-push-doctor")
    try:
        async with engine.connect() as connection:
            rows = (await connection.execute(REGISTERED)).all()
    except Exception as error:
        cause = error.orig if isinstance(error, DBAPIError) and error.orig else error
        raise TokensUnreadable(type(cause).__name__) from None
    finally:
        await engine.dispose()
    return [(r[0], r[1], int(r[2])) for r in rows]


def database_location(database_url: str) -> str:
    """host:port/database of ``database_url``, never its credentials."""
    try:
        url = make_url(database_url)
    except Exception:
        return "ATELIER_DATABASE_URL"
    host = url.host or url.query.get("host") or "localhost"
    return f"{host}:{url.port or 5432}/{url.database or ''}"

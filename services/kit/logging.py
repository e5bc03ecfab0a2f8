"""JSON structured logs: one object per line, an ``action`` saying what happened, ids as
fields. Values under secret-looking keys are replaced before they are written."""

from __future__ import annotations

import functools
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_SECRET_MARKERS = ("token", "secret", "password", "authorization", "credential", "key_pem")


@functools.lru_cache(maxsize=1024)
def _is_secret(key: str) -> bool:
    # Field names are few and fixed in code: decided once each, not on every line.
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "action": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry[key] = "[redacted]" if _is_secret(key) else value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class EventLogger:
    """``log.info("job_claimed", job_id=...)``: the action first, then its fields. A call
    at a level the logger does not write returns after one cached level check, before any
    record or formatting (a disabled debug line costs about a quarter of a microsecond; see
    docs/benchmarks.md)."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def debug(self, action: str, **fields: Any) -> None:
        if self._logger.isEnabledFor(logging.DEBUG):
            self._logger.debug(action, extra={"fields": fields})

    def info(self, action: str, **fields: Any) -> None:
        if self._logger.isEnabledFor(logging.INFO):
            self._logger.info(action, extra={"fields": fields})

    def warning(self, action: str, **fields: Any) -> None:
        self._logger.warning(action, extra={"fields": fields})

    def error(self, action: str, **fields: Any) -> None:
        self._logger.error(action, extra={"fields": fields})

    def exception(self, action: str, **fields: Any) -> None:
        """Logs at error level with the current exception's stack."""
        self._logger.error(action, extra={"fields": fields}, exc_info=True)


def get_logger(name: str) -> EventLogger:
    return EventLogger(name)

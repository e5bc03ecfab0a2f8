"""Prometheus metrics served on each service's metrics port."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import Counter, Histogram, start_http_server

from services.kit.ports import PortUnavailable

RPC_TOTAL = Counter(
    "atelier_rpc_total", "RPCs handled, by method and status code", ["service", "method", "code"]
)
RPC_SECONDS = Histogram(
    "atelier_rpc_duration_seconds",
    "RPC latency (for streams, the stream's lifetime), by method and status code",
    ["service", "method", "code"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


# The labelled series of each (service, method, code), looked up once: ``labels()`` takes
# a lock and builds its key on every call. Bounded by the methods servers register.
_series: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def observe_rpc(service: str, method: str, code: str, seconds: float) -> None:
    key = (service, method, code)
    series = _series.get(key)
    if series is None:
        series = _series[key] = (RPC_TOTAL.labels(*key), RPC_SECONDS.labels(*key))
    count, duration = series
    count.inc()
    duration.observe(seconds)


class MetricsEndpoint:
    """A started /metrics listener (a daemon thread); ``close`` stops it and frees its port."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(host: str, port: int, variable: str) -> MetricsEndpoint:
    """Starts the /metrics HTTP endpoint on a daemon thread; a port that cannot be
    listened on stops the process naming ``variable`` (e.g. CREATION_METRICS_PORT)."""
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError:
        raise PortUnavailable(host, port, variable) from None
    return MetricsEndpoint(server, thread)

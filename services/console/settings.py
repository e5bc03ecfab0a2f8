"""The console's settings (ATELIER_CONSOLE_*), validated at start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.kit.internal_tls import read_internal_tls
from services.kit.settings import DEFAULT_PORTS, EnvReader, port
from services.kit.tls import ServerCertificateFiles

DEFAULT_CONSOLE_PORT = 8090
DEFAULT_CONSOLE_METRICS_PORT = 9464


@dataclass(frozen=True)
class ConsoleSettings:
    # Where the console listens: loopback by default; a pod binds its own address, and
    # no edge route or network policy admits the public to it.
    host: str
    port: int
    # Prometheus text at /metrics on this port (the console's calls and refusals); 0: none.
    metrics_port: int
    # creation's internal listener, where AdminService answers.
    creation_internal_address: str
    # notify's internal listener, where NotifyAdminService (the failed pushes) answers.
    notify_internal_address: str
    # Each AdminService call's deadline.
    call_timeout_seconds: float
    # How long a credential's GetCaller answer (an operator or not) is trusted.
    caller_ttl_seconds: float
    log_level: str
    # The internal listeners' mutual TLS (ATELIER_INTERNAL_TLS_*), None: plaintext.
    internal_tls: ServerCertificateFiles | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConsoleSettings:
        reader = EnvReader(environ)
        creation = DEFAULT_PORTS["creation"].internal_port
        notify = DEFAULT_PORTS["notify"].internal_port
        settings = cls(
            host=reader.string("CONSOLE_HOST", "127.0.0.1"),
            port=port(reader, "CONSOLE_PORT", DEFAULT_CONSOLE_PORT),
            metrics_port=reader.integer(
                "CONSOLE_METRICS_PORT", DEFAULT_CONSOLE_METRICS_PORT, minimum=0, maximum=65535
            ),
            creation_internal_address=reader.string(
                "CREATION_INTERNAL_ADDRESS", f"127.0.0.1:{creation}"
            ),
            notify_internal_address=reader.string("NOTIFY_INTERNAL_ADDRESS", f"127.0.0.1:{notify}"),
            call_timeout_seconds=reader.seconds("CONSOLE_CALL_TIMEOUT", 15, minimum=1, maximum=120),
            caller_ttl_seconds=reader.seconds("CONSOLE_CALLER_TTL", 30, minimum=0, maximum=600),
            log_level=reader.string(
                "LOG_LEVEL", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
            ),
            internal_tls=read_internal_tls(reader),
        )
        reader.finish()
        return settings

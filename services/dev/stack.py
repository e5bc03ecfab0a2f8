"""The whole system on one machine: migrations, the three services as separate processes,
Envoy in front and the operator's console beside them (on its own port, never behind the
edge). `atelier dev` runs it in the foreground; acceptance tests start it on
free ports against a throwaway database."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.console.settings import DEFAULT_CONSOLE_PORT
from services.dev import apns_peer, edge, running
from services.dev.credentials import StackCredentials
from services.dev.processes import (
    Child,
    accepting,
    free_port,
    grpc_serving,
    http_ok,
    spawn,
    wait_until,
)
from services.kit import migrations
from services.kit.ports import PortUnavailable, is_free, listen_variable
from services.kit.settings import DEFAULT_PORTS, EnvReader, ListenSettings, port
from services.media.settings import DEFAULT_HTTP_PORT as MEDIA_HTTP_PORT

SERVICES = ("creation", "media", "notify")
ENVOY_PORT = 8080
ENVOY_ADMIN_PORT = 9901


@dataclass(frozen=True)
class StackPorts:
    public: dict[str, int]
    internal: dict[str, int]
    metrics: dict[str, int]
    envoy: int
    envoy_admin: int
    # media's plain-HTTP listener for the local storage backend's signed URLs.
    media_http: int
    # The operator's console (services/console), on the internal side: no edge route.
    console: int = DEFAULT_CONSOLE_PORT

    @classmethod
    def from_env(cls, reader: EnvReader) -> StackPorts:
        """The default ports, each overridable by the variable the service itself reads."""
        listen = {name: ListenSettings.read(reader, name, DEFAULT_PORTS[name]) for name in SERVICES}
        return cls(
            public={name: listen[name].public_port for name in SERVICES},
            internal={name: listen[name].internal_port for name in SERVICES},
            metrics={name: listen[name].metrics_port for name in SERVICES},
            envoy=port(reader, "EDGE_PORT", ENVOY_PORT),
            envoy_admin=port(reader, "EDGE_ADMIN_PORT", ENVOY_ADMIN_PORT),
            media_http=port(reader, "MEDIA_HTTP_PORT", MEDIA_HTTP_PORT),
            console=port(reader, "CONSOLE_PORT", DEFAULT_CONSOLE_PORT),
        )

    @classmethod
    def free(cls) -> StackPorts:
        return cls(
            public={name: free_port() for name in SERVICES},
            internal={name: free_port() for name in SERVICES},
            metrics={name: free_port() for name in SERVICES},
            envoy=free_port(),
            envoy_admin=free_port(),
            media_http=free_port(),
            console=free_port(),
        )

    def service_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for name in SERVICES:
            key = name.upper()
            env[f"ATELIER_{key}_PUBLIC_PORT"] = str(self.public[name])
            env[f"ATELIER_{key}_INTERNAL_PORT"] = str(self.internal[name])
            env[f"ATELIER_{key}_METRICS_PORT"] = str(self.metrics[name])
            env[f"ATELIER_{key}_INTERNAL_ADDRESS"] = f"127.0.0.1:{self.internal[name]}"
        env["ATELIER_MEDIA_HTTP_PORT"] = str(self.media_http)
        return env

    def named(self) -> dict[str, int]:
        """Every port, by the variable (without ATELIER_) that sets it."""
        ports = {
            listen_variable(name, kind): number
            for kind, by_service in (
                ("public", self.public),
                ("internal", self.internal),
                ("metrics", self.metrics),
            )
            for name, number in by_service.items()
        }
        return {
            **ports,
            "EDGE_PORT": self.envoy,
            "EDGE_ADMIN_PORT": self.envoy_admin,
            "MEDIA_HTTP_PORT": self.media_http,
            "CONSOLE_PORT": self.console,
        }

    def ensure_free(self, host: str = "127.0.0.1") -> None:
        """Fails before anything starts when another process holds one of the ports:
        otherwise a health check could be answered by that process instead of ours."""
        for variable, number in self.named().items():
            if not is_free(host, number):
                raise PortUnavailable(host, number, variable)

    def upstreams(self) -> dict[str, int]:
        """The edge's clusters and the local ports behind them."""
        return {**self.public, "media_http": self.media_http}


@dataclass(frozen=True)
class Replica:
    """A further process of a service (Stack.start_replica) and its listeners."""

    child: Child
    public_port: int
    internal_port: int
    metrics_port: int


@dataclass
class Stack:
    database_url: str
    ports: StackPorts
    work_dir: Path
    # None: children share the terminal (dev); a folder: one log file per child (tests).
    log_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    edge_max_json_body: int = edge.DEFAULT_MAX_JSON_BODY
    # Trusted hops, rate limit, access log path, TLS listener (ATELIER_EDGE_* settings).
    edge_options: edge.EdgeOptions = field(default_factory=edge.EdgeOptions)
    # creation's role: "all" runs the job engine beside the API; "api" leaves jobs queued
    # (benchmarks of the API alone).
    creation_role: str = "all"
    # Start the local APNs peer and point notify's sender at it (unless the environment
    # configures APNs itself): `atelier dev` shows the pushes a job produces.
    apns_peer: bool = False
    apns_peer_port: int = 0
    children: list[Child] = field(default_factory=list)
    apns_env: dict[str, str] = field(default_factory=dict)
    # One credential per calling identity (creation, notify, an operator, an app backend).
    credentials: StackCredentials = field(default_factory=StackCredentials)
    # The operator's console beside the services (`atelier dev` shows it); tests that
    # never open it leave it out, one process fewer per stack.
    console: bool = True

    def migrate(self) -> None:
        for name in SERVICES:
            migrations.upgrade(name, self.database_url)

    def state_env(self) -> dict[str, str]:
        """Local objects and the stub provider's requests live beside the stack's other
        state, signed URLs point at this stack's edge, and leases beat every second (a
        job of a few seconds shows its progress, a cancel lands within a second), and
        webhooks may go to a local receiver, unless the environment says otherwise (say,
        a LAN address for a phone)."""
        defaults = {
            "ATELIER_MEDIA_LOCAL_DIR": str(self.work_dir / "media"),
            "ATELIER_STUB_STATE_DIR": str(self.work_dir / "stub"),
            "ATELIER_MEDIA_PUBLIC_BASE_URL": f"http://127.0.0.1:{self.ports.envoy}",
            **self.direct_objects_env(),
            "ATELIER_HEARTBEAT": "1",
            # Webhooks to a receiver on this machine (plain http, loopback): dev only.
            "ATELIER_WEBHOOK_ALLOW_HTTP": "true",
            "ATELIER_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        }
        return {name: value for name, value in defaults.items() if name not in os.environ}

    def direct_objects_env(self) -> dict[str, str]:
        """A worker process of this stack sends its own GETs and PUTs of the local
        backend's signed URLs to media's object listener, not through the edge (the URLs
        handed out still name the edge, for remote workers and clients)."""
        public = os.environ.get(
            "ATELIER_MEDIA_PUBLIC_BASE_URL", f"http://127.0.0.1:{self.ports.envoy}"
        )
        return {
            "ATELIER_OBJECT_PUBLIC_BASE_URL": public,
            "ATELIER_OBJECT_DIRECT_BASE_URL": f"http://127.0.0.1:{self.ports.media_http}",
        }

    def start(self, timeout: float = 60.0) -> None:
        """Starts every service and the edge; returns once each service's public and
        internal health say SERVING, media's object listener takes connections and Envoy
        is ready."""
        self.ports.ensure_free()
        try:
            if self.apns_peer and "ATELIER_APNS_ENABLED" not in os.environ:
                self._start_apns_peer(timeout)
            for name in SERVICES:
                self.children.append(self._spawn_service(name))
            for child in self.children:
                self._wait_ready(child, timeout)
            config = edge.write(
                self.work_dir / "envoy.yaml",
                edge.render(
                    listen_port=self.ports.envoy,
                    admin_port=self.ports.envoy_admin,
                    upstream_ports=self.ports.upstreams(),
                    max_json_body=self.edge_max_json_body,
                    options=self.edge_options,
                ),
            )
            if self.console:
                console = self._spawn_console()
                self.children.append(console)
                wait_until(console, accepting(self.ports.console), timeout)
            envoy = spawn("envoy", edge.argv(config), {}, self.log_dir)
            self.children.append(envoy)
            wait_until(envoy, http_ok(f"http://127.0.0.1:{self.ports.envoy_admin}/ready"), timeout)
            # `atelier push doctor` beside it checks this stack's database and APNs peer.
            running.publish(
                self.work_dir, {"ATELIER_DATABASE_URL": self.database_url, **self.apns_env}
            )
        except BaseException:
            self.stop()
            raise

    def _start_apns_peer(self, timeout: float) -> None:
        state = self.work_dir / "apns"
        private_key, public_key = apns_peer.ensure_dev_key(state)
        port = self.apns_peer_port or free_port()
        argv = [
            sys.executable,
            "-m",
            "services.dev.apns_peer",
            "--public-key",
            str(public_key),
            "--key-id",
            apns_peer.DEV_KEY_ID,
            "--team-id",
            apns_peer.DEV_TEAM_ID,
            "--bundle-id",
            apns_peer.DEV_BUNDLE_ID,
            "--state-dir",
            str(state),
            "--port",
            str(port),
        ]
        child = spawn("apns-peer", argv, {}, self.log_dir)
        self.children.append(child)
        # The certificate is written before the peer listens.
        wait_until(child, accepting(port), timeout)
        url = f"https://127.0.0.1:{port}"
        self.apns_env = {
            "ATELIER_APNS_ENABLED": "true",
            "ATELIER_APNS_KEY_PATH": str(private_key),
            "ATELIER_APNS_KEY_ID": apns_peer.DEV_KEY_ID,
            "ATELIER_APNS_TEAM_ID": apns_peer.DEV_TEAM_ID,
            "ATELIER_APNS_BUNDLE_ID": apns_peer.DEV_BUNDLE_ID,
            "ATELIER_APNS_PRODUCTION_URL": url,
            "ATELIER_APNS_SANDBOX_URL": url,
            "ATELIER_APNS_CA_FILE": str(state / "apns-peer-cert.pem"),
        }

    def _service_env(self, name: str) -> dict[str, str]:
        return {
            # Said explicitly: a process without ATELIER_ENV is a production one.
            "ATELIER_ENV": "dev",
            "ATELIER_DATABASE_URL": self.database_url,
            **self.credentials.env(name),
            **self.ports.service_env(),
            **self.state_env(),
            **self.apns_env,
            **self.extra_env,
        }

    def _spawn_service(self, name: str) -> Child:
        role = ["--role", self.creation_role] if name == "creation" else []
        argv = [sys.executable, "-m", f"services.{name}", *role]
        return spawn(name, argv, self._service_env(name), self.log_dir)

    def _spawn_console(self) -> Child:
        env = {
            "ATELIER_ENV": "dev",
            "ATELIER_CONSOLE_PORT": str(self.ports.console),
            "ATELIER_CREATION_INTERNAL_ADDRESS": f"127.0.0.1:{self.ports.internal['creation']}",
            "ATELIER_NOTIFY_INTERNAL_ADDRESS": f"127.0.0.1:{self.ports.internal['notify']}",
            # No metrics listener: stacks run side by side (tests) would share its port.
            "ATELIER_CONSOLE_METRICS_PORT": "0",
        }
        return spawn("console", [sys.executable, "-m", "services.console"], env, self.log_dir)

    def _wait_ready(self, child: Child, timeout: float) -> None:
        if child.name not in SERVICES:
            return
        for listener in (self.ports.public, self.ports.internal):
            wait_until(child, grpc_serving(f"127.0.0.1:{listener[child.name]}"), timeout)
        if child.name == "media" and self._media_storage() != "s3":
            wait_until(child, accepting(self.ports.media_http), timeout)

    def _media_storage(self) -> str:
        """media's backend as its process sees it: only the local one has a listener."""
        return self.extra_env.get(
            "ATELIER_MEDIA_STORAGE", os.environ.get("ATELIER_MEDIA_STORAGE", "local")
        )

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def stop_service(self, name: str) -> int:
        """Stops one service (SIGTERM, as an orchestrator would); the rest keep running."""
        child = self.child(name)
        self.children.remove(child)
        return child.stop()

    def start_service(self, name: str, timeout: float = 60.0) -> Child:
        """Starts a stopped service again on its ports; returns once it is SERVING."""
        child = self._spawn_service(name)
        # Before the edge, so that stop() still stops the edge first.
        self.children.insert(0, child)
        self._wait_ready(child, timeout)
        return child

    def start_replica(
        self, name: str, timeout: float = 60.0, extra_env: Mapping[str, str] | None = None
    ) -> Replica:
        """Another process of service ``name`` against the same database, on listeners of
        its own (a second notify is a second push sender, as a second pod would be); the
        other services and the edge keep talking to the first. ``extra_env`` adds to (or
        overrides) its settings. Returns once it is SERVING."""
        replica = f"{name}-{1 + sum(c.name.startswith(name) for c in self.children)}"
        key = name.upper()
        listeners = {kind: free_port() for kind in ("PUBLIC", "INTERNAL", "METRICS")}
        env = {
            **self._service_env(name),
            **{f"ATELIER_{key}_{kind}_PORT": str(number) for kind, number in listeners.items()},
            **(extra_env or {}),
        }
        argv = [sys.executable, "-m", f"services.{name}"]
        child = spawn(replica, argv, env, self.log_dir)
        # Before the edge, so that stop() still stops the edge first.
        self.children.insert(0, child)
        for kind in ("PUBLIC", "INTERNAL"):
            wait_until(child, grpc_serving(f"127.0.0.1:{listeners[kind]}"), timeout)
        return Replica(child, listeners["PUBLIC"], listeners["INTERNAL"], listeners["METRICS"])

    def stop(self) -> dict[str, int]:
        """Stops the edge first, then the services; returns each child's exit code."""
        running.withdraw(self.work_dir)
        codes = {}
        for child in reversed(self.children):
            codes[child.name] = child.stop()
        self.children.clear()
        return codes

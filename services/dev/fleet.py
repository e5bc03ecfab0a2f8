"""Several replicas of every service on one machine: creation's API and its workers as
separate processes, media, notify, all on one PostgreSQL database and one Redis, with
Envoy balancing over the public listeners. The scale-out test and bench/scale_out.py
start one, run jobs and streams through the edge, and kill replicas under load.

Each replica has listeners of its own. The internal calls between services (creation →
media, creation's relay → notify, notify → media) go to every replica of the peer: the
address is a gRPC target listing them all (``ipv4:127.0.0.1:A,127.0.0.1:B``), so a call
finds a live replica when one is gone, as a Kubernetes Service would make it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.dev import edge
from services.dev.processes import (
    Child,
    accepting,
    free_port,
    grpc_serving,
    http_ok,
    spawn,
    venv_binary,
    wait_until,
)

# The kinds of replica, each a process of one service in one role.
KINDS = ("media", "notify", "creation-api", "creation-worker")
SERVICE = {
    "media": "media",
    "notify": "notify",
    "creation-api": "creation",
    "creation-worker": "creation",
}
# The edge clusters each kind's public listener serves (workers serve none).
CLUSTERS = {"creation-api": "creation", "media": "media", "notify": "notify"}
# A response header naming the replica that served a request (host:port): a test tells
# from it which streams a killed replica held.
UPSTREAM_HEADER = "x-atelier-upstream"


@dataclass(frozen=True)
class ReplicaPorts:
    public: int
    internal: int
    metrics: int
    # media's plain-HTTP object listener (0 for the other services).
    http: int = 0

    @classmethod
    def free(cls, kind: str) -> ReplicaPorts:
        return cls(free_port(), free_port(), free_port(), free_port() if kind == "media" else 0)


@dataclass
class FleetReplica:
    kind: str
    index: int
    ports: ReplicaPorts
    child: Child

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def pid(self) -> int:
        return self.child.process.pid


def targets(ports: list[int]) -> str:
    """A gRPC target naming every replica (pick_first moves to the next when one fails)."""
    if len(ports) == 1:
        return f"127.0.0.1:{ports[0]}"
    return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)


def fail_over(config: dict[str, Any]) -> dict[str, Any]:
    """The edge's own config (deploy/envoy/envoy.yaml already sends a request that never
    reached a replica to another one), with two changes for a test on one machine: a
    replica that refuses one connection is ejected at once, and each answer names the
    replica that gave it (UPSTREAM_HEADER), so a test knows which streams a kill cut."""
    for cluster in config["static_resources"]["clusters"]:
        cluster["outlier_detection"] = {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "interval": "0.5s",
            "base_ejection_time": "10s",
            "max_ejection_percent": 50,
        }
    listener = config["static_resources"]["listeners"][0]
    for chain_filter in listener["filter_chains"][0]["filters"]:
        for host in chain_filter["typed_config"]["route_config"]["virtual_hosts"]:
            for route in host["routes"]:
                if "route" not in route:
                    continue
                route["response_headers_to_add"] = [
                    {
                        "header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_HOST%"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    }
                ]
    return config


@dataclass
class Fleet:
    database_url: str
    redis_url: str
    work_dir: Path
    # Processes of each kind.
    replicas: int = 2
    # Settings for every service process (the test's or the bench's).
    extra_env: Mapping[str, str] = field(default_factory=dict)
    edge_port: int = field(default_factory=free_port)
    edge_admin_port: int = field(default_factory=free_port)
    running: list[FleetReplica] = field(default_factory=list)
    envoy: Child | None = None

    def __post_init__(self) -> None:
        self.ports = {
            kind: [ReplicaPorts.free(kind) for _ in range(self.replicas)] for kind in KINDS
        }

    @property
    def edge_url(self) -> str:
        return f"http://127.0.0.1:{self.edge_port}"

    @property
    def edge_address(self) -> str:
        return f"127.0.0.1:{self.edge_port}"

    def internal_target(self, kind: str) -> str:
        return targets([p.internal for p in self.ports[kind]])

    def _env(self, kind: str, ports: ReplicaPorts) -> dict[str, str]:
        key = SERVICE[kind].upper()
        env = {
            "ATELIER_ENV": "test",
            "ATELIER_DATABASE_URL": self.database_url,
            f"ATELIER_{key}_PUBLIC_PORT": str(ports.public),
            f"ATELIER_{key}_INTERNAL_PORT": str(ports.internal),
            f"ATELIER_{key}_METRICS_PORT": str(ports.metrics),
            "ATELIER_MEDIA_INTERNAL_ADDRESS": self.internal_target("media"),
            "ATELIER_NOTIFY_INTERNAL_ADDRESS": self.internal_target("notify"),
            "ATELIER_CREATION_INTERNAL_ADDRESS": self.internal_target("creation-api"),
            "ATELIER_REDIS_URL": self.redis_url,
            # One object store and one stub provider state for all replicas, as a bucket
            # and a vendor would be.
            "ATELIER_MEDIA_LOCAL_DIR": str(self.work_dir / "media"),
            "ATELIER_STUB_STATE_DIR": str(self.work_dir / "stub"),
            "ATELIER_MEDIA_PUBLIC_BASE_URL": self.edge_url,
            **self.extra_env,
        }
        if kind == "media":
            env["ATELIER_MEDIA_HTTP_PORT"] = str(ports.http)
        return env

    def _spawn(self, kind: str, index: int) -> FleetReplica:
        ports = self.ports[kind][index]
        argv = [sys.executable, "-m", f"services.{SERVICE[kind]}"]
        if kind.startswith("creation-"):
            argv += ["--role", kind.removeprefix("creation-")]
        child = spawn(f"{kind}-{index}", argv, self._env(kind, ports), self.work_dir / "logs")
        return FleetReplica(kind, index, ports, child)

    def _wait_ready(self, replica: FleetReplica, timeout: float) -> None:
        listeners = [replica.ports.internal]
        if replica.kind != "creation-worker":
            listeners.append(replica.ports.public)
        for port in listeners:
            wait_until(replica.child, grpc_serving(f"127.0.0.1:{port}"), timeout)
        if replica.kind == "media":
            wait_until(replica.child, accepting(replica.ports.http), timeout)

    def edge_config(self) -> dict[str, Any]:
        upstreams: dict[str, list[int]] = {
            cluster: [p.public for p in self.ports[kind]] for kind, cluster in CLUSTERS.items()
        }
        upstreams["media_http"] = [p.http for p in self.ports["media"]]
        config = edge.render(
            listen_port=self.edge_port,
            admin_port=self.edge_admin_port,
            upstream_ports=upstreams,
        )
        return fail_over(config)

    def start(self, timeout: float = 90.0) -> None:
        """Every replica, all at once; returns once each is SERVING and Envoy is ready."""
        try:
            for kind in KINDS:
                for index in range(self.replicas):
                    self.running.append(self._spawn(kind, index))
            for replica in self.running:
                self._wait_ready(replica, timeout)
            config = edge.write(self.work_dir / "envoy.yaml", self.edge_config())
            argv = [venv_binary("envoy"), "-c", str(config), "--disable-hot-restart"]
            self.envoy = spawn("envoy", [*argv, "--log-level", "warn"], {}, self.work_dir / "logs")
            wait_until(self.envoy, http_ok(f"http://127.0.0.1:{self.edge_admin_port}/ready"), 30)
        except BaseException:
            self.stop()
            raise

    def replica(self, kind: str, index: int) -> FleetReplica:
        return next(r for r in self.running if r.kind == kind and r.index == index)

    def kill(self, kind: str, index: int) -> FleetReplica:
        """SIGKILL: no drain, no goodbye, as a node that dies; returns once it is gone."""
        replica = self.replica(kind, index)
        replica.child.process.send_signal(signal.SIGKILL)
        replica.child.process.wait()
        self.running.remove(replica)
        return replica

    def pids(self, kind: str) -> list[int]:
        return [r.pid for r in self.running if r.kind == kind]

    def stop(self) -> dict[str, int]:
        """The edge first, then every replica (SIGTERM); each one's exit code."""
        codes: dict[str, int] = {}
        if self.envoy is not None:
            codes["envoy"] = self.envoy.stop()
            self.envoy = None
        for replica in reversed(self.running):
            codes[replica.name] = replica.child.stop()
        self.running.clear()
        return codes

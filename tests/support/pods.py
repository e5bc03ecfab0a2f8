"""A pod runner for tests: the rendered manifests' Deployments and Jobs run as containers in
a real engine (tests/support/container_runtime.py), as a kubelet would start them.

What is honoured: command/args over the image's ENTRYPOINT/CMD; env from the rendered
ConfigMaps and the test's Secrets (envFrom, then env; `optional` references may be
missing); the securityContext (user and group, read-only root, dropped capabilities, no
privilege escalation); resources.limits as the container's memory and CPU limits; emptyDirs
as tmpfs volumes shared by the pod's containers; ConfigMap and Secret volumes as read-only
files; init containers run to completion first. Each pod gets an address on a network the
test creates, under its Services' names (the engine's DNS), so pods find each other by the
names the settings use. Probes (gRPC health, HTTP GET) are polled from the test; stopping
runs the preStop hook, sends SIGTERM, and kills at terminationGracePeriodSeconds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.dev import postgres
from tests.support.container_runtime import docker

Manifest = dict[str, Any]


def _quantity_bytes(value: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return int(float(value.removesuffix(suffix)) * factor)
    return int(value)


def _cpus(value: str) -> str:
    return str(int(value.removesuffix("m")) / 1000) if value.endswith("m") else str(value)


def _ok(probe_result: bool | None) -> bool:
    return probe_result is True


class Forwarder:
    """Carries TCP connections from an address the pods can reach (the network's gateway)
    to a server of the test session's (PostgreSQL, Redis on the loopback or a unix socket):
    the pods reach the suite's real servers."""

    def __init__(self, listen_host: str) -> None:
        self._host = listen_host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: list[asyncio.Server] = []

    def forward(self, target: tuple[str, int] | str) -> int:
        """A port on the listen host that leads to ``target`` ((host, port), or a path)."""

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                if isinstance(target, str):
                    up_reader, up_writer = await asyncio.open_unix_connection(target)
                else:
                    up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def start() -> int:
            server = await asyncio.start_server(handle, self._host, 0)
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        return asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass
class Stopped:
    """How a pod's main container ended."""

    exit_code: int
    seconds: float  # from the start of preStop to the container's exit
    killed: bool  # SIGKILL at the grace period's end
    pre_stop_exit: int | None


@dataclass
class Pod:
    name: str
    spec: Manifest
    ip: str
    containers: list[str] = field(default_factory=list)  # main containers' ids

    @property
    def main(self) -> Manifest:
        container: Manifest = self.spec["containers"][0]
        return container

    def probe(self, kind: str) -> bool | None:
        """One try of the main container's ``kind`` probe (readinessProbe, livenessProbe,
        startupProbe): True passed, False failed, None: none declared."""
        probe = self.main.get(kind)
        if probe is None:
            return None
        timeout = float(probe.get("timeoutSeconds", 1))
        if "grpc" in probe:
            address = f"{self.ip}:{probe['grpc']['port']}"
            try:
                with grpc.insecure_channel(address) as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                        timeout=timeout,
                    )
            except grpc.RpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
        if "httpGet" in probe:
            port = self.port(probe["httpGet"]["port"])
            try:
                answer = httpx.get(
                    f"http://{self.ip}:{port}{probe['httpGet'].get('path', '/')}", timeout=timeout
                )
            except httpx.HTTPError:
                return False
            return 200 <= answer.status_code < 400
        raise AssertionError(f"{self.name}: a probe this runner does not know: {probe}")

    def port(self, port: int | str) -> int:
        """A container port's number, by number or by name."""
        if isinstance(port, int):
            return port
        [number] = [p["containerPort"] for p in self.main.get("ports", []) if p["name"] == port]
        return int(number)

    def until_ready(self, seconds: float = 90) -> float:
        """Seconds until the startup (then readiness) probe passes; fails with the logs."""
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if self.exited() is not None:
                break
            if self.probe("startupProbe") is not False and _ok(self.probe("readinessProbe")):
                return time.monotonic() - started
            time.sleep(0.25)
        raise AssertionError(
            f"{self.name} was not ready within {seconds} s "
            f"(exit {self.exited()}):\n{self.logs()[-4000:]}"
        )

    def exited(self) -> int | None:
        state = docker(
            "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", self.containers[0]
        )
        running, code = state.stdout.split()
        return None if running == "true" else int(code)

    def logs(self) -> str:
        done = docker("logs", self.containers[0], check=False)
        return done.stdout + done.stderr

    def stop(self) -> Stopped:
        """What the kubelet does: preStop, then SIGTERM, then SIGKILL at the grace period's
        end (the preStop hook's time counts against it)."""
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        container = self.containers[0]
        started = time.monotonic()
        pre_stop_exit = None
        hook = self.main.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook:
            done = docker("exec", container, *hook["command"], timeout=grace, check=False)
            pre_stop_exit = done.returncode
        docker("kill", "--signal=TERM", container, check=False)
        killed = False
        left = grace - (time.monotonic() - started)
        waited = docker("wait", container, timeout=max(left, 0.1) + 1, check=False)
        if time.monotonic() - started > grace or waited.returncode != 0:
            docker("kill", "--signal=KILL", container, check=False)
            killed = True
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container).stdout)
        return Stopped(code, time.monotonic() - started, killed, pre_stop_exit)


class PodRunner:
    """Runs one overlay's pods: ``secrets`` maps (Secret name, key) to values;
    ``settings`` replaces entries of the rendered ConfigMaps (the cluster's own addresses)."""

    def __init__(
        self,
        docs: list[Manifest],
        images: dict[str, str],
        secrets: dict[tuple[str, str], str],
        work: Path,
    ) -> None:
        self.docs = docs
        self.images = images
        self.secrets = secrets
        self.work = work
        self.id = uuid.uuid4().hex[:8]
        self.network = f"atelier-pods-{self.id}"
        self.pods: list[Pod] = []
        self._subnet = ipaddress.ip_network(
            f"10.{200 + int(self.id[:2], 16) % 50}.{int(self.id[2:4], 16)}.0/24"
        )
        self._addresses: dict[str, str] = {}
        self._shared_dirs: list[Path] = []

    @property
    def gateway(self) -> str:
        return str(self._subnet.network_address + 1)

    def address(self, name: str) -> str:
        """The workload's pod address (fixed before it starts: settings may name it)."""
        if name not in self._addresses:
            self._addresses[name] = str(self._subnet.network_address + 10 + len(self._addresses))
        return self._addresses[name]

    def open(self) -> None:
        docker(
            "network",
            "create",
            f"--subnet={self._subnet}",
            f"--gateway={self.gateway}",
            self.network,
        )

    def close(self) -> None:
        for pod in self.pods:
            ids = pod.containers + [f"{self.network}-{pod.name}-init-{i}" for i in range(4)]
            docker("rm", "-f", *ids, check=False)
        docker("network", "rm", self.network, check=False)
        for directory in set(self._shared_dirs):
            shutil.rmtree(directory, ignore_errors=True)

    def config_map(self, name: str) -> dict[str, str]:
        [found] = [
            d for d in self.docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name
        ]
        return dict(found.get("data", {}))

    def workload(self, kind: str, name: str) -> Manifest:
        [found] = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        spec: Manifest = found["spec"]["template"]["spec"]
        return spec

    def aliases(self, pod_labels: dict[str, str]) -> list[str]:
        """The names of the Services that select these labels (the pod's DNS names)."""
        names = []
        for doc in self.docs:
            if doc["kind"] != "Service":
                continue
            selector = doc["spec"].get("selector", {})
            if selector and all(pod_labels.get(k) == v for k, v in selector.items()):
                names.append(doc["metadata"]["name"])
        return names

    def environment(self, container: Manifest) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                data = self.config_map(source["configMapRef"]["name"])
            else:
                data = {
                    key: value
                    for (secret, key), value in self.secrets.items()
                    if secret == source["secretRef"]["name"]
                }
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
                continue
            reference = variable["valueFrom"]
            key_ref = reference.get("configMapKeyRef") or reference.get("secretKeyRef")
            assert key_ref is not None, f"{variable['name']}: unsupported {reference}"
            if "configMapKeyRef" in reference:
                value = self.config_map(key_ref["name"]).get(key_ref["key"])
            else:
                value = self.secrets.get((key_ref["name"], key_ref["key"]))
            if value is None:
                assert key_ref.get("optional"), f"{variable['name']}: {key_ref} is missing"
                continue
            env[variable["name"]] = value
        return env

    def _files(self, pod: str, volume: Manifest) -> Path:
        """A ConfigMap's or Secret's files, as the kubelet projects them."""
        directory = self.work / pod / volume["name"]
        directory.mkdir(parents=True)
        if "configMap" in volume:
            items = self.config_map(volume["configMap"]["name"])
        else:
            name = volume["secret"]["secretName"]
            items = {key: value for (secret, key), value in self.secrets.items() if secret == name}
            assert items, f"the test has no Secret {name}"
        # Only the keys listed, under their paths, when the volume lists them.
        if "items" in volume.get("configMap", volume.get("secret", {})):
            listed = volume.get("configMap", volume.get("secret", {}))["items"]
            missing = [i["key"] for i in listed if i["key"] not in items]
            assert not missing, f"{pod} {volume['name']}: no key {missing}"
            items = {i["path"]: items[i["key"]] for i in listed}
        for key, value in items.items():
            (directory / key).write_text(value)
            (directory / key).chmod(0o644)
        directory.chmod(0o755)
        return directory

    def _container_args(
        self, pod: str, spec: Manifest, container: Manifest, mounts: dict[str, list[str]]
    ) -> list[str]:
        security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        user = security.get("runAsUser")
        group = security.get("runAsGroup", user)
        args = []
        if user is not None:
            assert not (security.get("runAsNonRoot") and user == 0), f"{pod}: runs as root"
            args.append(f"--user={user}:{group}")
            if "fsGroup" in security:
                args.append(f"--group-add={security['fsGroup']}")
        if security.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        for cap in security.get("capabilities", {}).get("drop", []):
            args.append(f"--cap-drop={cap}")
        if security.get("allowPrivilegeEscalation") is False:
            args.append("--security-opt=no-new-privileges")
        limits = container.get("resources", {}).get("limits", {})
        if "memory" in limits:
            args.append(f"--memory={_quantity_bytes(limits['memory'])}")
        if "cpu" in limits:
            args.append(f"--cpus={_cpus(str(limits['cpu']))}")
        for mount in container.get("volumeMounts", []):
            for source in mounts[mount["name"]]:
                if source.startswith("tmpfs:"):
                    args.append(f"--tmpfs={mount['mountPath']}:{source.removeprefix('tmpfs:')}")
                    continue
                readonly = ",readonly" if mount.get("readOnly") else ""
                args.append(f"--mount={source},target={mount['mountPath']}{readonly}")
        for name, value in self.environment(container).items():
            args += ["-e", f"{name}={value}"]
        if "command" in container:
            args.append(f"--entrypoint={container['command'][0]}")
        image = self.images[container["image"].split(":")[0]]
        rest = [*container["command"][1:]] if "command" in container else []
        return [*args, image, *rest, *container.get("args", [])]

    def _empty_dir(
        self, pod: str, volume: Manifest, containers: list[Manifest], user: int, group: int
    ) -> list[str]:
        """A tmpfs of the declared size for one container; for several (an init container
        writing what the main one reads), a directory on the host's /dev/shm (a tmpfs too,
        but without the size limit), which both mount."""
        users = [
            c
            for c in containers
            if any(m["name"] == volume["name"] for m in c.get("volumeMounts", []))
        ]
        if len(users) == 1:
            size = _quantity_bytes(volume["emptyDir"].get("sizeLimit", "64Mi"))
            return [f"tmpfs:rw,size={size},uid={user},gid={group},mode=0770"]
        directory = Path("/dev/shm") / self.network / pod / volume["name"]
        directory.mkdir(parents=True)
        os.chown(directory, user, group)
        directory.chmod(0o770)
        self._shared_dirs.append(directory.parents[1])
        return [f"type=bind,source={directory}"]

    def start(self, kind: str, name: str, replica: int = 0) -> Pod:
        """Starts one replica of the workload: its init containers to completion, then its
        main container (detached). Replicas past the first are pods of their own
        (``<name>-<replica>``, an address of their own) under the same Service names, so
        the engine's DNS answers a Service's name with every replica, as a headless
        Service's does."""
        spec = self.workload(kind, name)
        [doc] = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        pod_name = f"{name}-{replica}" if replica else name
        ip = self.address(pod_name)
        pod = Pod(pod_name, spec, ip)
        self.pods.append(pod)
        mounts: dict[str, list[str]] = {}
        user = spec.get("securityContext", {}).get("runAsUser", 0)
        group = spec.get("securityContext", {}).get("fsGroup", user)
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        for volume in spec.get("volumes", []):
            if "emptyDir" in volume:
                mounts[volume["name"]] = self._empty_dir(pod_name, volume, containers, user, group)
            elif "configMap" in volume or "secret" in volume:
                mounts[volume["name"]] = [f"type=bind,source={self._files(pod_name, volume)}"]
            else:
                raise AssertionError(f"{name}: a volume this runner does not know: {volume}")
        network = [f"--network={self.network}", f"--ip={ip}", f"--hostname={pod_name}"]
        network += [f"--network-alias={alias}" for alias in self.aliases(labels)]
        for index, init in enumerate(spec.get("initContainers", [])):
            done = docker(
                "run", f"--name={self.network}-{pod_name}-init-{index}", *network,
                *self._container_args(pod_name, spec, init, mounts),
                timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"{pod_name} init {init['name']}: {done.stderr[-3000:]}"
        for main in spec["containers"]:
            started = docker(
                "run", "--detach", f"--name={self.network}-{pod_name}-{main['name']}", *network,
                *self._container_args(pod_name, spec, main, mounts),
            )  # fmt: skip
            pod.containers.append(started.stdout.strip())
        return pod

    def run_to_completion(self, kind: str, name: str, timeout: float = 300) -> tuple[int, str]:
        """A Job's pod: its exit code and output."""
        pod = self.start(kind, name)
        docker("wait", pod.containers[0], timeout=timeout)
        return int(
            docker("inspect", "-f", "{{.State.ExitCode}}", pod.containers[0]).stdout
        ), pod.logs()


def reachable_url(url: str, forwarder: Forwarder, gateway: str) -> str:
    """A PostgreSQL or Redis URL of the test session's (loopback or unix socket) as the pods
    reach it: through a port of ``forwarder`` on the network's gateway."""
    if url.startswith("redis") or url.startswith("unix://"):
        if url.startswith("unix://"):
            port = forwarder.forward(url.removeprefix("unix://").split("?")[0])
            return f"redis://{gateway}:{port}/0"
        found = re.match(r"^(rediss?://(?:[^@/]*@)?)([^:/?]+)(?::(\d+))?(.*)$", url)
        assert found, url
        port = forwarder.forward((found[2], int(found[3] or 6379)))
        return f"{found[1]}{gateway}:{port}{found[4]}"
    where = postgres.connect_kwargs(url)
    host, server_port = str(where["host"]), int(str(where["port"]))
    target = f"{host}/.s.PGSQL.{server_port}" if host.startswith("/") else (host, server_port)
    port = forwarder.forward(target)
    password = f":{where['password']}" if where["password"] else ""
    return f"postgresql://{where['user']}{password}@{gateway}:{port}/{where['database']}"


@contextmanager
def pod_runner(
    docs: list[Manifest], images: dict[str, str], secrets: dict[tuple[str, str], str], work: Path
) -> Iterator[PodRunner]:
    runner = PodRunner(docs, images, secrets, work)
    runner.open()
    try:
        yield runner
    finally:
        runner.close()

"""Outages with real processes: creation and media as service processes against a
PostgreSQL this module starts for itself (never the machine's shared one), which it then
stops and freezes; media is killed and frozen. For each: what clients get (UNAVAILABLE
naming the dependency, with RetryInfo; never INTERNAL or UNKNOWN), how fast each call
fails, what health says, that the logs hold no stack trace per failure, and how soon after
the dependency is back the first call succeeds.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
)
from services.dev import postgres
from services.dev.processes import Child, free_port, grpc_serving, spawn, wait_until
from services.kit import migrations
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from tests.support.pg_outage import OwnPostgres, wait_for
from tests.support.rpc import bearer, error_info, retry_delay

# What a patient client would allow a call; an outage must answer well inside it.
CLIENT_DEADLINE = 10.0
FAIL_FAST = 5.0
RECOVERY = 2.0
# Health must follow the database within readiness period + timeout (1 s + 1.5 s),
# with slack for a loaded machine.
HEALTH_FLIP = 5.0
USER = f"outage-{uuid.uuid4().hex[:8]}"
TOKEN = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", USER, 3600)


@dataclass
class Service:
    name: str
    env: dict[str, str]
    public: int
    internal: int
    log_dir: Path
    children: list[Child] = field(default_factory=list)

    @property
    def child(self) -> Child:
        return self.children[-1]

    def serving(self) -> bool:
        return grpc_serving(f"127.0.0.1:{self.public}")()

    def start(self) -> None:
        name = self.name if not self.children else f"{self.name}-{len(self.children)}"
        child = spawn(name, [sys.executable, "-m", f"services.{self.name}"], self.env, self.log_dir)
        self.children.append(child)
        wait_until(child, grpc_serving(f"127.0.0.1:{self.public}"), 60)

    def signal(self, sig: signal.Signals) -> None:
        self.child.process.send_signal(sig)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for child in self.children:
            assert child.log_path is not None
            for raw in child.log_path.read_text(errors="replace").splitlines():
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    lines.append({"action": "unstructured", "text": raw})
        return lines


@dataclass
class System:
    pg: dict[str, OwnPostgres]  # each service's own
    creation: Service
    media: Service
    asset_id: str


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 120, 200)).save(buffer, "PNG")
    return buffer.getvalue()


def _put_input(media_internal: int) -> str:
    data = _png()

    def parts() -> Iterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=USER,
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                content_type="image/png",
            )
        )
        yield media_internal_service_pb2.PutAssetRequest(chunk=data)

    with grpc.insecure_channel(f"127.0.0.1:{media_internal}") as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = stub.PutAsset(parts(), metadata=bearer(DEV_SERVICE_TOKEN), timeout=10)
    return str(reply.asset.asset_id)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """creation and media each on a PostgreSQL of its own, so that the test can take one
    service's database away and see which dependency each answer names."""
    work = tmp_path_factory.mktemp("outages")
    pgs = {name: OwnPostgres() for name in ("creation", "media")}
    ports = {name: (free_port(), free_port(), free_port()) for name in ("creation", "media")}
    media_http = free_port()
    env = {
        "ATELIER_ENV": "dev",
        "ATELIER_DRAIN_GRACE": "1",
        "ATELIER_MEDIA_HTTP_PORT": str(media_http),
        "ATELIER_MEDIA_LOCAL_DIR": str(work / "objects"),
        "ATELIER_MEDIA_PUBLIC_BASE_URL": f"http://127.0.0.1:{media_http}",
        "ATELIER_MEDIA_INTERNAL_ADDRESS": f"127.0.0.1:{ports['media'][1]}",
        # Every recovery probe makes a job: limits must not be what refuses it.
        "ATELIER_IN_FLIGHT_LIMIT": "1000",
        "ATELIER_DAILY_QUOTA": "100000",
        "ATELIER_WELCOME_POINTS": "1000000",
        # Every submit asks media about its input, so each one meets media's outage (an
        # input media vouched for within the cache's TTL would not need media at all).
        "ATELIER_ASSET_CACHE_TTL": "0",
    }
    for name, (public, internal, metrics) in ports.items():
        key = name.upper()
        env[f"ATELIER_{key}_PUBLIC_PORT"] = str(public)
        env[f"ATELIER_{key}_INTERNAL_PORT"] = str(internal)
        env[f"ATELIER_{key}_METRICS_PORT"] = str(metrics)
    services = {}
    for name, pg in pgs.items():
        url = postgres.ensure_database(pg.admin_url, "atelier")
        migrations.upgrade(name, url)
        services[name] = Service(
            name, {**env, "ATELIER_DATABASE_URL": url}, *ports[name][:2], work / "logs"
        )
    try:
        services["media"].start()
        services["creation"].start()
        yield System(pgs, services["creation"], services["media"], _put_input(ports["media"][1]))
    finally:
        for service in services.values():
            for child in service.children:
                child.stop()
        for pg in pgs.values():
            pg.close()


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    reason: str
    retry_after: float | None
    seconds: float
    cause: str = ""


def _ask(call: Callable[[], object]) -> Answer:
    started = time.monotonic()
    try:
        call()
    except grpc.RpcError as error:
        seconds = time.monotonic() - started
        code = error.code()  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED):
            info = error_info(error)
            cause = info.metadata.get("cause", "")
            return Answer(code, info.reason, retry_delay(error), seconds, cause)
        return Answer(code, "", None, seconds)
    return Answer(grpc.StatusCode.OK, "", None, time.monotonic() - started)


class Client:
    def __init__(self, system: System) -> None:
        self._system = system
        self._channel = grpc.insecure_channel(f"127.0.0.1:{system.creation.public}")
        self._stub = creation_service_pb2_grpc.CreationServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def balance(self) -> Answer:
        return _ask(
            lambda: self._stub.GetBalance(
                creation_service_pb2.GetBalanceRequest(),
                metadata=bearer(TOKEN),
                timeout=CLIENT_DEADLINE,
            )
        )

    def submit(self) -> Answer:
        request = creation_service_pb2.SubmitJobRequest(
            model_id="stub-fast",
            style_id="watercolor",
            input_asset_id=self._system.asset_id,
            width=512,
            height=512,
        )
        return _ask(
            lambda: self._stub.SubmitJob(request, metadata=bearer(TOKEN), timeout=CLIENT_DEADLINE)
        )

    def health(self) -> int:
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return -1
        return int(reply.status)


@pytest.fixture
def client(system: System) -> Iterator[Client]:
    client = Client(system)
    # Each scenario starts from a healthy system.
    wait_for(lambda: client.submit().code == grpc.StatusCode.OK, 30, "a healthy system")
    yield client
    client.close()


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _assert_unavailable(answer: Answer, reasons: set[str]) -> None:
    assert answer.code == grpc.StatusCode.UNAVAILABLE, answer
    assert answer.reason in reasons, answer
    assert answer.retry_after is not None and answer.retry_after > 0, answer
    assert answer.seconds < FAIL_FAST, answer
    print(f"{answer.reason} in {answer.seconds:.2f}s")


def _seconds_to_first_ok(call: Callable[[], Answer]) -> float:
    started = time.monotonic()
    while True:
        answer = call()
        if answer.code == grpc.StatusCode.OK:
            seconds = time.monotonic() - started
            print(f"first OK after {seconds:.2f}s")  # figures for the report (pytest -s)
            return seconds
        # Until then, only retryable answers.
        assert answer.code == grpc.StatusCode.UNAVAILABLE, answer
        assert time.monotonic() - started < 30, "never recovered"
        time.sleep(0.05)


def _assert_quiet_logs(service: Service, since: int, failures: int) -> None:
    """No stack trace for any failure, and outage lines bounded (throttled), whatever the
    number of failed calls."""
    lines = service.log_lines()[since:]
    traces = [line for line in lines if "Traceback" in json.dumps(line)]
    assert traces == [], traces[:1]
    outage_lines = [line for line in lines if line.get("action") == "dependency_unavailable"]
    assert len(outage_lines) <= 8, outage_lines
    assert failures >= 3  # the bound above means something only with many failures
    assert all(line.get("action") != "unstructured" for line in lines), lines[:3]


@pytest.mark.parametrize("owner", ["creation", "media"])
@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_a_services_postgres_out(system: System, client: Client, fault: str, owner: str) -> None:
    """Stopped: an immediate shutdown, every backend gone. Frozen: SIGSTOP on the server
    and its backends, sockets open and nothing answering."""
    pg = system.pg[owner]
    down = system.creation if owner == "creation" else system.media
    mark = {s.name: len(s.log_lines()) for s in (system.creation, system.media)}
    pg.stop() if fault == "stopped" else pg.freeze()
    failures = 0
    try:
        wait_for(lambda: not down.serving(), HEALTH_FLIP, f"{owner} NOT_SERVING")
        for _ in range(10 if fault == "stopped" else 3):
            if owner == "creation":
                _assert_unavailable(client.balance(), {"DATABASE_UNAVAILABLE"})
                # media answers the input check; creation's own database is what fails.
                _assert_unavailable(client.submit(), {"DATABASE_UNAVAILABLE"})
                failures += 2
            else:
                # Only media's database is out: creation names media, with media's own
                # reason as the cause (or the deadline creation gave media, when frozen).
                answer = client.submit()
                _assert_unavailable(answer, {"MEDIA_UNAVAILABLE"})
                causes = {"DATABASE_UNAVAILABLE", "DEADLINE_EXCEEDED"}
                assert answer.cause in (causes if fault == "frozen" else {"DATABASE_UNAVAILABLE"})
                assert client.balance().code == grpc.StatusCode.OK
                assert client.health() == SERVING
                failures += 1
    finally:
        pg.start() if fault == "stopped" else pg.thaw()
    wait_for(pg.answers, 30, "PostgreSQL back")
    if owner == "creation":
        assert _seconds_to_first_ok(client.balance) <= RECOVERY
    assert _seconds_to_first_ok(client.submit) <= RECOVERY
    wait_for(down.serving, HEALTH_FLIP, f"{owner} SERVING again")
    _assert_quiet_logs(system.creation, mark["creation"], failures)
    _assert_quiet_logs(system.media, mark["media"], failures)


def test_media_killed(system: System, client: Client) -> None:
    mark = len(system.creation.log_lines())
    system.media.signal(signal.SIGKILL)
    system.media.child.process.wait(10)
    failures = 0
    for _ in range(10):
        _assert_unavailable(client.submit(), {"MEDIA_UNAVAILABLE"})
        failures += 1
    # creation itself is fine: its reads still work and it stays in rotation.
    assert client.balance().code == grpc.StatusCode.OK
    assert client.health() == SERVING
    system.media.start()  # returns once media's health says SERVING
    assert _seconds_to_first_ok(client.submit) <= RECOVERY
    _assert_quiet_logs(system.creation, mark, failures)


def test_media_frozen(system: System, client: Client) -> None:
    mark = len(system.creation.log_lines())
    system.media.signal(signal.SIGSTOP)
    try:
        failures = 0
        for _ in range(5):
            answer = client.submit()
            _assert_unavailable(answer, {"MEDIA_UNAVAILABLE"})
            failures += 1
        assert client.balance().code == grpc.StatusCode.OK
        assert client.health() == SERVING
    finally:
        system.media.signal(signal.SIGCONT)
    wait_for(grpc_serving(f"127.0.0.1:{system.media.public}"), 10, "media SERVING")
    assert _seconds_to_first_ok(client.submit) <= RECOVERY
    _assert_quiet_logs(system.creation, mark, failures)


def test_sigterm_keeps_serving_through_the_window_then_drains(
    tmp_path: Path, system: System
) -> None:
    """A second media process (it has background components) with a 3 s drain window."""
    public, internal = free_port(), free_port()
    env = {
        **system.media.env,
        "ATELIER_DRAIN_WINDOW": "3",
        "ATELIER_MEDIA_PUBLIC_PORT": str(public),
        "ATELIER_MEDIA_INTERNAL_PORT": str(internal),
        "ATELIER_MEDIA_METRICS_PORT": str(free_port()),
        "ATELIER_MEDIA_HTTP_PORT": str(free_port()),
    }
    draining = Service("media", env, public, internal, tmp_path)
    draining.start()
    pid = draining.child.process.pid
    with grpc.insecure_channel(f"127.0.0.1:{internal}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        os.kill(pid, signal.SIGTERM)
        wait_for(
            lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == NOT_SERVING,
            2,
            "NOT_SERVING after SIGTERM",
        )
        # Inside the window: new calls are still served.
        for _ in range(3):
            reply = stub.GetAssetInfo(
                media_internal_service_pb2.GetAssetInfoRequest(asset_id=system.asset_id),
                metadata=bearer(DEV_SERVICE_TOKEN),
                timeout=2,
            )
            assert reply.asset.asset_id == system.asset_id
    assert draining.child.process.wait(15) == 0
    actions = [line.get("action") for line in draining.log_lines()]
    order = ["service_draining", "components_stopped", "servers_draining", "service_stopped"]
    assert [a for a in actions if a in order] == order

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
from concurrent.futures import ThreadPoolExecutor
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
from services.creation.media_client import CALL_TIMEOUT_SECONDS as MEDIA_CALL_TIMEOUT
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


def _put_input(media_internal: int, owner: str = USER) -> str:
    data = _png()

    def parts() -> Iterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner,
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
                # reason as the cause.
                answer = client.submit()
                _assert_unavailable(answer, {"MEDIA_UNAVAILABLE"})
                # media answers within the deadline creation gives it, frozen or not.
                assert answer.cause == "DATABASE_UNAVAILABLE"
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


# Calls at once against a frozen database: more than the pool's 20 connections, so that
# some wait for a connection while others wait for their statement.
CONCURRENT = 32
FREEZE = 8.0
# The service's call deadline (3 s by default), plus what a loaded machine adds to the
# answer's way back. Before every call had one deadline, calls took up to ~12 s.
CALL_BOUND = 5.0
# A client that allows less than the service's deadline has its answer by its own.
SHORT_CLIENT_DEADLINE = 1.5


@dataclass(frozen=True)
class Caller:
    user: str
    token: str
    asset_id: str


def _submit(
    stub: creation_service_pb2_grpc.CreationServiceStub,
    caller: Caller,
    key: str,
    deadline: float = CLIENT_DEADLINE,
) -> tuple[Answer, str]:
    """The answer, and the job's id when it is OK."""
    request = creation_service_pb2.SubmitJobRequest(
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id=caller.asset_id,
        width=512,
        height=512,
        request_id=key,
    )
    job_id: list[str] = []

    def call() -> None:
        reply = stub.SubmitJob(request, metadata=bearer(caller.token), timeout=deadline)
        job_id.append(reply.job.job_id)

    answer = _ask(call)
    return answer, job_id[0] if job_id else ""


def _assert_database_unavailable(answer: Answer, bound: float) -> None:
    assert answer.code == grpc.StatusCode.UNAVAILABLE, answer
    assert answer.reason == "DATABASE_UNAVAILABLE", answer
    assert answer.retry_after is not None and answer.retry_after > 0, answer
    assert answer.seconds < bound, answer


def test_concurrent_submits_answer_by_the_call_deadline_while_postgres_is_frozen(
    system: System, client: Client
) -> None:
    """Each user submits over and over with a new request id while creation's PostgreSQL
    is frozen: every call answers UNAVAILABLE naming the database within the bound. Once
    it thaws, every request id sent during the freeze, sent again, makes one job (or
    finds the one a frozen call committed after all), and the pool serves a burst."""
    callers = []
    for index in range(CONCURRENT):
        user = f"{USER}-flood-{index}"
        token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user, 3600)
        callers.append(Caller(user, token, _put_input(system.media.internal, user)))
    mark = len(system.creation.log_lines())
    sent: list[tuple[Caller, str, Answer]] = []
    with grpc.insecure_channel(f"127.0.0.1:{system.creation.public}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)

        def flood(caller: Caller, until: float) -> list[tuple[Caller, str, Answer]]:
            answers = []
            while time.monotonic() < until:
                key = str(uuid.uuid4())
                answers.append((caller, key, _submit(stub, caller, key)[0]))
            return answers

        system.pg["creation"].freeze()
        try:
            until = time.monotonic() + FREEZE
            with ThreadPoolExecutor(CONCURRENT + 1) as pool:
                floods = [pool.submit(flood, caller, until) for caller in callers]
                short_key = str(uuid.uuid4())
                short = pool.submit(
                    _submit, stub, callers[0], short_key, SHORT_CLIENT_DEADLINE
                ).result()[0]
                for answers in floods:
                    sent.extend(answers.result())
        finally:
            system.pg["creation"].thaw()
        slowest = max(answer.seconds for _, _, answer in sent)
        print(f"{len(sent)} submits while frozen, slowest {slowest:.2f}s")  # pytest -s
        for _, _, answer in sent:
            _assert_database_unavailable(answer, CALL_BOUND)
        _assert_database_unavailable(short, SHORT_CLIENT_DEADLINE)
        assert len(sent) >= 2 * CONCURRENT  # every caller met the outage more than once
        # Cancelled waits and dropped connections leave no stack trace behind, and the
        # outage is a line per kind and component (calls, relay, probes), not per call.
        lines = system.creation.log_lines()[mark:]
        assert [line for line in lines if "Traceback" in json.dumps(line)] == []
        outage_lines = [line for line in lines if line.get("action") == "dependency_unavailable"]
        assert len(outage_lines) <= 12 < len(sent), outage_lines

        wait_for(system.pg["creation"].answers, 30, "PostgreSQL back")
        assert _seconds_to_first_ok(client.submit) <= RECOVERY
        # The same request ids again: one job per id, whether a frozen call's submit
        # committed after all (a replay finds it) or not (this one makes it).
        retried = [(caller, key) for caller, key, _ in sent] + [(callers[0], short_key)]
        with ThreadPoolExecutor(CONCURRENT) as pool:
            first = list(pool.map(lambda ck: _submit(stub, *ck), retried))
            second = list(pool.map(lambda ck: _submit(stub, *ck), retried))
        assert [a.code for a, _ in first] == [grpc.StatusCode.OK] * len(retried), first[:3]
        assert [job for _, job in second] == [job for _, job in first]
        assert len({job for _, job in first}) == len(retried)
        # Nothing the cancelled calls held is missing from the pool: more calls at once
        # than it holds are all served, none waiting past the pool's timeout.
        with ThreadPoolExecutor(CONCURRENT) as pool:
            burst = list(
                pool.map(lambda caller: _submit(stub, caller, str(uuid.uuid4()))[0], callers)
            )
        assert all(answer.code == grpc.StatusCode.OK for answer in burst), burst[:3]


def test_concurrent_media_calls_answer_by_their_callers_deadline_while_its_postgres_is_frozen(
    system: System, client: Client
) -> None:
    """The same rule in media, with the deadline creation gives its calls to media, which
    is shorter than media's own and than the bound of media's waits: every call answers
    UNAVAILABLE naming the database before it (not DEADLINE_EXCEEDED, with no reason)."""
    with grpc.insecure_channel(f"127.0.0.1:{system.media.internal}") as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        request = media_internal_service_pb2.GetAssetUrlRequest(asset_id=system.asset_id)

        def ask(deadline: float) -> Answer:
            return _ask(
                lambda: stub.GetAssetUrl(
                    request, metadata=bearer(DEV_SERVICE_TOKEN), timeout=deadline
                )
            )

        def read(until: float) -> list[Answer]:
            answers = []
            while time.monotonic() < until:
                answers.append(ask(MEDIA_CALL_TIMEOUT))
            return answers

        system.pg["media"].freeze()
        try:
            until = time.monotonic() + FREEZE
            with ThreadPoolExecutor(CONCURRENT) as pool:
                floods = [pool.submit(read, until) for _ in range(CONCURRENT)]
                answers = [answer for flood in floods for answer in flood.result()]
        finally:
            system.pg["media"].thaw()
        print(f"{len(answers)} media calls, slowest {max(a.seconds for a in answers):.2f}s")
        for answer in answers:
            _assert_database_unavailable(answer, MEDIA_CALL_TIMEOUT)
        assert len(answers) >= 2 * CONCURRENT
        wait_for(system.pg["media"].answers, 30, "PostgreSQL back")
        wait_for(lambda: ask(5).code == grpc.StatusCode.OK, 10, "media serving again")

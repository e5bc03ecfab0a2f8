"""The edge over TLS: a certificate made for the test, the TLS listener rendered from the
ATELIER_EDGE_TLS_* settings, and calls through it with curl (HTTP/JSON over HTTP/2) and
grpcurl (native gRPC); plus every rendered form of the config passes
`envoy --mode validate`."""

from __future__ import annotations

import copy
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.creation.waits import MAX_WAIT_SECONDS
from services.dev import edge
from services.dev.processes import free_port, venv_binary
from services.dev.stack import Stack
from services.kit.settings import EnvReader, SettingsError
from services.notify.settings import StreamSettings
from tests.support.certificates import self_signed
from tests.support.edges import RunningEdge, manager, routes, running_edge, validate

DESCRIPTOR = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"
HSTS = "max-age=31536000; includeSubDomains"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


def tls_options(certificate: tuple[Path, Path], **more: str) -> edge.EdgeOptions:
    """The options as `atelier dev` reads them from its environment."""
    cert, key = certificate
    reader = EnvReader(
        {
            "ATELIER_EDGE_TLS_CERT": str(cert),
            "ATELIER_EDGE_TLS_KEY": str(key),
            "ATELIER_EDGE_TLS_PORT": str(free_port()),
            **more,
        }
    )
    options = edge.EdgeOptions.read(reader)
    reader.finish()
    return options


@pytest.fixture(scope="module")
def tls_edge(
    stack: Stack, certificate: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningEdge, int]]:
    options = tls_options(certificate)
    config = edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports=stack.ports.upstreams(),
        options=options,
    )
    with running_edge(config, tmp_path_factory.mktemp("tls-edge")) as running:
        yield running, options.tls_port


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def test_curl_calls_the_api_over_tls_and_http2(
    tls_edge: tuple[RunningEdge, int], certificate: tuple[Path, Path], token: str
) -> None:
    _, port = tls_edge
    result = run(
        "curl",
        "-sS",
        "--cacert",
        str(certificate[0]),
        "-H",
        f"authorization: Bearer {token}",
        "-w",
        "\n%{http_code} %{http_version}",
        f"https://127.0.0.1:{port}/v1/catalog",
    )
    assert result.returncode == 0, result.stderr
    body, _, status = result.stdout.rpartition("\n")
    assert status == "200 2"
    assert json.loads(body)["models"]


def test_grpcurl_calls_the_api_over_tls(
    tls_edge: tuple[RunningEdge, int], certificate: tuple[Path, Path], token: str
) -> None:
    _, port = tls_edge
    result = run(
        venv_binary("grpcurl"),
        "-cacert",
        str(certificate[0]),
        "-protoset",
        str(DESCRIPTOR),
        "-H",
        f"authorization: Bearer {token}",
        "-d",
        "{}",
        f"127.0.0.1:{port}",
        "atelier.creation.v1.CreationService/ListCatalog",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["models"]


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    tls_edge: tuple[RunningEdge, int],
) -> None:
    _, port = tls_edge
    result = run("curl", "-sS", f"https://127.0.0.1:{port}/v1/catalog")
    assert result.returncode != 0
    assert "certificate" in result.stderr


def rendered(options: edge.EdgeOptions) -> dict[str, Any]:
    return edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports={"creation": 1, "media": 2, "notify": 3, "media_http": 4},
        options=options,
    )


def test_every_rendered_config_is_valid(certificate: tuple[Path, Path], tmp_path: Path) -> None:
    plain = rendered(edge.EdgeOptions())
    assert [x["name"] for x in plain["static_resources"]["listeners"]] == ["edge"]
    validate(plain, tmp_path)
    options = tls_options(
        certificate,
        ATELIER_EDGE_XFF_TRUSTED_HOPS="2",
        ATELIER_EDGE_RATE_LIMIT_BURST="50",
        ATELIER_EDGE_RATE_LIMIT_PER_SECOND="5",
        ATELIER_EDGE_ACCESS_LOG=str(tmp_path / "access.log"),
        ATELIER_EDGE_MAX_CONNECTIONS="1000",
    )
    config = rendered(options)
    listeners = config["static_resources"]["listeners"]
    assert [x["name"] for x in listeners] == ["edge", "edge_tls"]
    assert manager(config)["xff_num_trusted_hops"] == 2
    assert manager(config)["access_log"][0]["typed_config"]["path"] == str(tmp_path / "access.log")
    # Both listeners run the same connection manager, but for HSTS: only HTTPS answers
    # carry it.
    tls_manager = listeners[1]["filter_chains"][0]["filters"][0]["typed_config"]
    assert without_hsts(tls_manager) == manager(config) != tls_manager
    validate(config, tmp_path)


def without_hsts(manager: dict[str, Any]) -> dict[str, Any]:
    plain = copy.deepcopy(manager)
    for http_filter in plain["http_filters"]:
        if http_filter["name"] == edge.HEADER_MUTATION:
            mutations = http_filter["typed_config"]["mutations"]["response_mutations"]
            mutations[:] = [m for m in mutations if "append" not in m]
    return plain


def test_hsts_is_on_https_answers_only(
    tls_edge: tuple[RunningEdge, int], certificate: tuple[Path, Path]
) -> None:
    running, port = tls_edge
    # A route of the API and a path with no route: the edge's own answer carries it too.
    for path in ("/openapi.json", "/no-such-route"):
        trust = ssl.create_default_context(cafile=certificate[0])
        secure = httpx.get(f"https://127.0.0.1:{port}{path}", verify=trust)
        assert secure.headers["strict-transport-security"] == HSTS
        assert "strict-transport-security" not in httpx.get(f"{running.url}{path}").headers


def test_tls_needs_both_a_certificate_and_a_key(certificate: tuple[Path, Path]) -> None:
    reader = EnvReader({"ATELIER_EDGE_TLS_CERT": str(certificate[0])})
    edge.EdgeOptions.read(reader)
    with pytest.raises(SettingsError, match="EDGE_TLS_KEY"):
        reader.finish()


WAITING_PATHS = {
    "/atelier.creation.v1.CreationService/WaitJob",
    "/atelier.creation.v1.CreationService/SubmitJob",
}


def test_watch_streams_outlive_notifys_own_end_and_other_routes_are_bounded() -> None:
    """notify ends a stream after at most its maximum (jittered down) and keeps a quiet
    one alive; the edge's maximum and idle timeout are above those. Every other gRPC
    route has a timeout and honours grpc-timeout up to it; only reads are retried."""
    config = rendered(edge.EdgeOptions())
    streams = StreamSettings()
    # A quiet stream carries a KeepAlive long before the edge would call it idle.
    idle = float(manager(config)["stream_idle_timeout"].removesuffix("s"))
    assert idle > 4 * streams.keep_alive_seconds
    retried = []
    for route in routes(config):
        action = route.get("route")
        if action is None or action["cluster"] == "media_http":
            continue
        duration = action["max_stream_duration"]
        assert duration["grpc_timeout_header_max"] == duration["max_stream_duration"]
        if action["cluster"] == "notify_streams":
            assert action["timeout"] == "0s"
            longest = float(duration["max_stream_duration"].removesuffix("s"))
            assert longest > streams.max_duration_seconds
        elif route["match"].get("path") in WAITING_PATHS:
            # A call may wait up to the longest wait, then read the job: a longer bound.
            assert action["timeout"] == duration["max_stream_duration"]
            assert float(action["timeout"].removesuffix("s")) > MAX_WAIT_SECONDS
        else:
            assert action["timeout"] == duration["max_stream_duration"] == "30s"
        # Every route sends a request that never reached a replica to another one; only
        # reads are retried after a replica saw them (reset, UNAVAILABLE).
        retry_on = set(action["retry_policy"]["retry_on"].split(","))
        assert {"connect-failure", "refused-stream", "reset-before-request"} <= retry_on
        if retry_on & {"reset", "unavailable"}:
            retried.append(route["match"].get("path") or route["match"]["safe_regex"]["regex"])
    assert retried == [
        r"/atelier\.creation\.v1\.CreationService/(ListCatalog|GetJob|ListJobs|GetBalance|ListLedgerEntries)",
        "/atelier.creation.v1.CreationService/WaitJob",
        "/atelier.media.v1.MediaService/GetAsset",
        "/atelier.notify.v1.NotifyService/ListDevices",
    ]

"""grpcurl through the real edge, with reflection: it answers at once (it used to wait four
minutes for "stream timeout"), lists and describes the public services the edge routes and
never an internal one, and calls them without -protoset."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest

from services.dev.processes import venv_binary
from services.dev.stack import Stack

# grpcurl answers in well under a second; the bound allows a loaded machine, and the bug
# took four minutes.
BOUND_SECONDS = 30
INTERNAL_SERVICES = (
    "atelier.creation.v1.AdminService",
    "atelier.creation.v1.WorkerService",
    "atelier.media.v1.MediaInternalService",
    "atelier.notify.v1.NotifyIngestService",
    "atelier.notify.v1.NotifyFeedService",
    "atelier.notify.v1.NotifyAdminService",
)


def grpcurl(
    address: str, *command: str, options: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [venv_binary("grpcurl"), "-plaintext", *options, address, *command],
            capture_output=True,
            text=True,
            timeout=BOUND_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"grpcurl {' '.join(command)} gave no answer in {BOUND_SECONDS} s")


@pytest.fixture(scope="module")
def edge(stack: Stack) -> str:
    return f"127.0.0.1:{stack.ports.envoy}"


def test_list_answers_at_once_with_the_public_services(edge: str) -> None:
    result = grpcurl(edge, "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "atelier.creation.v1.CreationService",
        "atelier.media.v1.MediaService",
        "atelier.notify.v1.NotifyService",
        "grpc.reflection.v1alpha.ServerReflection",
    ]


@pytest.mark.parametrize(
    ("symbol", "documented"),
    [
        ("atelier.creation.v1.CreationService.SubmitJob", "// Submits a generation job."),
        ("atelier.media.v1.MediaService", "rpc CreateUpload"),
        ("atelier.notify.v1.NotifyService.WatchJobs", "rpc WatchJobs"),
    ],
)
def test_describe_shows_each_public_service_with_its_comments(
    edge: str, symbol: str, documented: str
) -> None:
    result = grpcurl(edge, "describe", symbol)
    assert result.returncode == 0, result.stderr
    assert documented in result.stdout


@pytest.mark.parametrize("symbol", [*INTERNAL_SERVICES, "grpc.health.v1.Health"])
def test_internal_services_cannot_be_described_through_the_edge(edge: str, symbol: str) -> None:
    result = grpcurl(edge, "describe", symbol)
    assert result.returncode != 0
    assert "Symbol not found" in result.stderr, result.stderr


def test_a_public_method_is_called_through_the_edge_without_protoset(edge: str, token: str) -> None:
    result = grpcurl(
        edge,
        "atelier.creation.v1.CreationService/ListCatalog",
        options=["-H", f"authorization: Bearer {token}"],
    )
    assert result.returncode == 0, result.stderr
    assert '"model_id": "stub-fast"' in result.stdout


def test_a_service_keeps_its_own_listing_on_its_own_port(stack: Stack) -> None:
    result = grpcurl(f"127.0.0.1:{stack.ports.public['media']}", "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "atelier.media.v1.MediaService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ]


def never_ending(stop: threading.Event) -> Iterator[bytes]:
    """A request stream that stays open until the test ends, as a bidi client's does."""
    stop.wait()
    yield from ()


def test_an_unrouted_stream_is_unimplemented_at_once(edge: str) -> None:
    # Reflection v1 (what grpcurl 1.9 asks first, falling back to v1alpha on UNIMPLEMENTED)
    # has no route: the edge must answer without waiting for the request stream to end.
    stop = threading.Event()
    with grpc.insecure_channel(edge) as channel:
        call = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
        try:
            with pytest.raises(grpc.RpcError) as raised:
                next(iter(call(never_ending(stop), timeout=BOUND_SECONDS)))
        finally:
            stop.set()
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]

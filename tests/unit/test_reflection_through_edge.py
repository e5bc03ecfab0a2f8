"""What reflection through the edge may describe: the services the edge routes, with their
comments, and no file an internal service lives in."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from google.protobuf import descriptor_pb2

from services.kit.reflection import EDGE_SERVICES, load_documented, public_api_pool

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
TRANSCODER = "envoy.filters.http.grpc_json_transcoder"


def test_the_edge_services_are_the_ones_the_edge_transcodes() -> None:
    config = yaml.safe_load(TEMPLATE.read_text())
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    transcoder = next(f for f in manager["typed_config"]["http_filters"] if f["name"] == TRANSCODER)
    assert tuple(transcoder["typed_config"]["services"]) == EDGE_SERVICES


@pytest.mark.parametrize(
    "symbol",
    [
        "atelier.creation.v1.AdminService",
        "atelier.creation.v1.AdminService.GrantPoints",
        "atelier.creation.v1.GrantPointsRequest",
        "atelier.creation.v1.WorkerService",
        "atelier.media.v1.MediaInternalService",
        "atelier.notify.v1.NotifyIngestService",
        "atelier.notify.v1.NotifyFeedService",
        "atelier.notify.v1.NotifyFeedService.WatchAllJobs",
        "atelier.notify.v1.WatchAllJobsRequest",
        "atelier.notify.v1.NotifyAdminService",
        "atelier.notify.v1.NotifyAdminService.ListFailedPushes",
        "atelier.notify.v1.FailedPush",
    ],
)
def test_internal_symbols_are_not_found(symbol: str) -> None:
    with pytest.raises(KeyError):
        public_api_pool().FindFileContainingSymbol(symbol)


def test_internal_files_and_their_messages_are_not_found() -> None:
    pool = public_api_pool()
    internal = [file for name, file in load_documented().items() if name not in pool.files]
    assert "atelier/creation/v1/admin_service.proto" in [file.name for file in internal]
    for file in internal:
        with pytest.raises(KeyError):
            pool.FindFileByName(file.name)
        for message in file.message_type:
            with pytest.raises(KeyError):
                pool.FindMessageTypeByName(f"{file.package}.{message.name}")


def test_public_symbols_come_with_their_comments_and_proto_field_names() -> None:
    found = public_api_pool().FindFileContainingSymbol("atelier.media.v1.MediaService.CreateUpload")
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    assert proto.name == "atelier/media/v1/media_service.proto"
    assert proto.HasField("source_code_info")
    assert not any(f.HasField("json_name") for m in proto.message_type for f in m.field)
    names = {d.name for d in found.dependencies}
    assert "google/api/annotations.proto" in names

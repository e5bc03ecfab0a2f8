"""creation's client for media when media is not there: SubmitJob must answer
UNAVAILABLE (retryable), GetJob and ListJobs must still show the jobs, just without their
pictures."""

from __future__ import annotations

import grpc
import pytest

from services.creation.errors import MediaUnavailable
from services.creation.media_client import MediaClient
from services.dev.processes import free_port
from services.kit.settings import DEV_SERVICE_TOKEN

ASSET = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"


async def test_media_down_is_unavailable_for_checks_and_no_url_for_reads() -> None:
    client = MediaClient(f"127.0.0.1:{free_port()}", DEV_SERVICE_TOKEN)
    try:
        with pytest.raises(MediaUnavailable) as caught:
            await client.asset_info(ASSET)
        assert caught.value.to_api_error().code == grpc.StatusCode.UNAVAILABLE
        assert caught.value.to_api_error().reason == "MEDIA_UNAVAILABLE"
        assert await client.download_url(ASSET) is None
        assert await client.output_urls([ASSET, ASSET]) == {}
    finally:
        await client.close()

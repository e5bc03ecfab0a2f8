"""A real S3-protocol server for tests: moto's server mode (``ThreadedMotoServer``) on a
free local port, speaking the S3 HTTP API presigned URLs included, in memory only."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from aiobotocore.session import AioSession
from moto.server import ThreadedMotoServer

from services.dev.processes import free_port
from services.media.settings import S3Settings

ACCESS_KEY_ID = "atelier-test-key"
SECRET_ACCESS_KEY = "atelier-test-secret"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    # The server logs every request at INFO through werkzeug; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_settings(endpoint: str, bucket: str) -> S3Settings:
    return S3Settings(
        endpoint_url=endpoint,
        public_endpoint_url="",
        bucket=bucket,
        region="us-east-1",
        access_key_id=ACCESS_KEY_ID,
        secret_access_key=SECRET_ACCESS_KEY,
        path_style=True,
    )


@pytest.fixture
async def s3_bucket(s3_endpoint: str) -> S3Settings:
    """A new, empty bucket for one test, and the settings that point media at it."""
    settings = s3_settings(s3_endpoint, f"atelier-{uuid.uuid4().hex[:16]}")
    session = AioSession()
    async with session.create_client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=settings.region,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    ) as client:
        await client.create_bucket(Bucket=settings.bucket)
    return settings

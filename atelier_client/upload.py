"""Sending an upload's bytes to the signed URL that CreateUpload handed out (plain HTTP,
the standard library's client: uploads are for tests and benchmarks, not a hot path)."""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit

from atelier.media.v1 import media_service_pb2
from atelier_client.errors import UploadFailed


def put(created: media_service_pb2.CreateUploadResponse, data: bytes, timeout: float) -> None:
    """PUTs ``data`` with exactly the headers the upload demands; raises UploadFailed."""
    if urlsplit(created.upload_url).scheme not in {"http", "https"}:
        raise UploadFailed(f"refusing to upload to {created.upload_url!r}")
    request = urllib.request.Request(  # noqa: S310 the scheme is checked above
        created.upload_url,
        data=data,
        method=created.upload_method or "PUT",
        headers=dict(created.upload_headers),
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            response.read()
    except urllib.error.HTTPError as error:
        raise UploadFailed(f"the upload answered HTTP {error.code}") from error
    except OSError as error:
        raise UploadFailed(f"the upload failed: {error}") from error

"""Object storage: S3 (production, MinIO) or a local directory (``atelier dev``)."""

from services.media.storage.base import (
    DownloadWindows,
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    ObjectStorage,
    SignedRequest,
    Validity,
    WholeObject,
)

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "DownloadWindows",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectStat",
    "ObjectStorage",
    "SignedRequest",
    "Validity",
    "WholeObject",
    "base",
    "local",
    "s3",
    "signing",
]

"""Object storage: S3 (production, MinIO) or a local directory (``atelier dev``)."""

from services.media.storage.base import (
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    ObjectStorage,
    SignedRequest,
    WholeObject,
)

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "ObjectExists",
    "ObjectNotFound",
    "ObjectStat",
    "ObjectStorage",
    "SignedRequest",
    "WholeObject",
    "base",
    "local",
    "s3",
    "signing",
]

"""Object storage: S3 (production, MinIO) or a local directory (``atelier dev``)."""

from services.media.storage.base import (
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    ObjectStorage,
    SignedRequest,
    WholeObject,
)

__all__ = [
    "ObjectExists",
    "ObjectNotFound",
    "ObjectStat",
    "ObjectStorage",
    "SignedRequest",
    "WholeObject",
]

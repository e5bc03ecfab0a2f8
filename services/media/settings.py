"""media's settings: where objects live, how long signed URLs last, what an upload may be."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.kit.settings import DEFAULT_PORTS, CommonSettings, EnvReader, ListenSettings, port

# Development-only key for the local backend's signed URLs; prod refuses it.
DEV_URL_SECRET = "atelier-dev-media-url-secret-not-for-production"
# media's plain-HTTP listener for the local backend's signed URLs (beside 50052/50062).
DEFAULT_HTTP_PORT = 50072
# Where `atelier dev` serves the edge; local signed URLs point there by default.
DEFAULT_PUBLIC_BASE_URL = "http://127.0.0.1:8080"
# Pillow's own bomb threshold: ours must stay at or below it so that we, not a Pillow
# warning, decide what is too large.
PILLOW_MAX_PIXELS = 89_478_485
MIB = 1024 * 1024
# S3 presigned URLs live at most a week (SigV4's limit).
PRESIGN_MAX_SECONDS = 7 * 24 * 3600

STORAGE_BACKENDS = ("local", "s3")


def _networks_valid(networks: tuple[str, ...]) -> bool:
    try:
        for network in networks:
            ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str  # empty: the AWS default for the region
    public_endpoint_url: str  # empty: sign URLs for endpoint_url
    bucket: str
    region: str
    access_key_id: str  # empty (with the secret): the default credential chain
    secret_access_key: str
    path_style: bool  # MinIO and most self-hosted S3 servers want path-style addressing


@dataclass(frozen=True)
class MediaSettings:
    common: CommonSettings
    listen: ListenSettings
    storage_backend: str
    local_dir: Path
    url_secret: str
    http_port: int
    public_base_url: str
    s3: S3Settings
    upload_url_ttl_seconds: int
    download_url_ttl_seconds: int
    download_url_window_seconds: int
    max_upload_bytes: int
    max_image_pixels: int
    chunk_bytes: int
    housekeeping_period_seconds: float
    housekeeping_batch: int
    abandoned_write_age_seconds: int
    thumbnail_backfill_batch: int
    thumbnail_poll_seconds: float
    # ImportAsset: the fetch's time limit, the networks a test allows beside public
    # addresses (never in prod), and a CA file trusted beside the system's (tests).
    import_timeout_seconds: float = 10.0
    import_allowed_networks: tuple[str, ...] = ()
    import_ca_file: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MediaSettings:
        reader = EnvReader(environ)
        common = CommonSettings.read(reader)
        backend = reader.string("MEDIA_STORAGE", "local", choices=STORAGE_BACKENDS)
        settings = cls(
            common=common,
            listen=ListenSettings.read(reader, "media", DEFAULT_PORTS["media"]),
            storage_backend=backend,
            # Relative paths are taken from the working directory once, at start.
            local_dir=Path(reader.string("MEDIA_LOCAL_DIR", "./var/media")).resolve(),
            url_secret=reader.secret("MEDIA_URL_SECRET", DEV_URL_SECRET, min_length=32),
            http_port=port(reader, "MEDIA_HTTP_PORT", DEFAULT_HTTP_PORT),
            public_base_url=reader.string("MEDIA_PUBLIC_BASE_URL", DEFAULT_PUBLIC_BASE_URL).rstrip(
                "/"
            ),
            s3=S3Settings(
                endpoint_url=reader.string("MEDIA_S3_ENDPOINT", ""),
                public_endpoint_url=reader.string("MEDIA_S3_PUBLIC_ENDPOINT", ""),
                bucket=reader.string("MEDIA_S3_BUCKET", ""),
                region=reader.string("MEDIA_S3_REGION", "us-east-1"),
                access_key_id=reader.string("MEDIA_S3_ACCESS_KEY_ID", ""),
                secret_access_key=reader.secret("MEDIA_S3_SECRET_ACCESS_KEY", "", min_length=8),
                path_style=reader.string("MEDIA_S3_PATH_STYLE", "false", choices=("true", "false"))
                == "true",
            ),
            upload_url_ttl_seconds=reader.integer(
                "MEDIA_UPLOAD_URL_TTL", 900, minimum=10, maximum=PRESIGN_MAX_SECONDS
            ),
            # A download URL works at least this long after any read that handed it out.
            download_url_ttl_seconds=reader.integer(
                "MEDIA_DOWNLOAD_URL_TTL", 300, minimum=10, maximum=PRESIGN_MAX_SECONDS
            ),
            # Download URLs are signed per epoch-aligned window of this length: every read
            # within one window gets the same URL (a client's image cache hits), which
            # expires the TTL after the window ends. 1 signs a URL per second.
            download_url_window_seconds=reader.integer(
                "MEDIA_DOWNLOAD_URL_WINDOW", 3600, minimum=1, maximum=PRESIGN_MAX_SECONDS
            ),
            max_upload_bytes=reader.byte_count(
                "MAX_UPLOAD_BYTES", 20 * MIB, minimum=1024, maximum=512 * MIB
            ),
            max_image_pixels=reader.integer(
                "MEDIA_MAX_IMAGE_PIXELS", 50_000_000, minimum=1, maximum=PILLOW_MAX_PIXELS
            ),
            chunk_bytes=reader.byte_count(
                # Below gRPC's default 4 MiB message limit, with room for the envelope.
                "MEDIA_CHUNK_BYTES",
                256 * 1024,
                minimum=4096,
                maximum=3 * MIB,
            ),
            housekeeping_period_seconds=reader.seconds(
                "MEDIA_HOUSEKEEPING_PERIOD", 60, minimum=0.1, maximum=3600
            ),
            housekeeping_batch=reader.integer(
                "MEDIA_HOUSEKEEPING_BATCH", 100, minimum=1, maximum=10_000
            ),
            # An unfinished write untouched this long is abandoned: housekeeping removes it
            # (a local .part file, an S3 multipart upload). It also bounds how long after
            # its upload URL expired a PUT may still be arriving.
            abandoned_write_age_seconds=reader.integer(
                "MEDIA_ABANDONED_WRITE_AGE", 3600, minimum=60, maximum=PRESIGN_MAX_SECONDS
            ),
            # Ready outputs without a thumbnail that the thumbnail maker takes per round,
            # at most (every new output, and those stored before migration 0005); 0 turns
            # thumbnails off.
            thumbnail_backfill_batch=reader.integer(
                "MEDIA_THUMBNAIL_BACKFILL_BATCH", 20, minimum=0, maximum=1000
            ),
            # How often the thumbnail maker looks for outputs another replica committed
            # (one committed here wakes it at once).
            thumbnail_poll_seconds=reader.seconds(
                "MEDIA_THUMBNAIL_POLL", 1.0, minimum=0.05, maximum=60
            ),
            import_timeout_seconds=reader.seconds(
                "MEDIA_IMPORT_TIMEOUT", 10, minimum=0.5, maximum=60
            ),
            import_allowed_networks=tuple(
                n.strip()
                for n in reader.string("MEDIA_IMPORT_ALLOWED_NETWORKS", "").split(",")
                if n.strip()
            ),
            import_ca_file=reader.string("MEDIA_IMPORT_CA_FILE", ""),
        )
        reader.require(
            _networks_valid(settings.import_allowed_networks),
            "MEDIA_IMPORT_ALLOWED_NETWORKS",
            "must be a comma-separated list of networks (CIDR)",
        )
        reader.require(
            not (common.env == "prod" and settings.import_allowed_networks),
            "MEDIA_IMPORT_ALLOWED_NETWORKS",
            "is a test setting: prod fetches from public addresses only",
        )
        reader.require(
            not settings.import_ca_file or Path(settings.import_ca_file).is_file(),
            "MEDIA_IMPORT_CA_FILE",
            "must name a readable PEM file",
        )
        reader.require(
            settings.public_base_url.startswith(("http://", "https://")),
            "MEDIA_PUBLIC_BASE_URL",
            "must start with http:// or https://",
        )
        reader.require(
            settings.download_url_window_seconds + settings.download_url_ttl_seconds
            <= PRESIGN_MAX_SECONDS,
            "MEDIA_DOWNLOAD_URL_WINDOW",
            f"plus ATELIER_MEDIA_DOWNLOAD_URL_TTL must be at most {PRESIGN_MAX_SECONDS} s"
            " (a signed URL's longest life)",
        )
        if backend == "s3":
            reader.require(bool(settings.s3.bucket), "MEDIA_S3_BUCKET", "must be set for s3")
            reader.require(
                bool(settings.s3.access_key_id) == bool(settings.s3.secret_access_key),
                "MEDIA_S3_ACCESS_KEY_ID",
                "and ATELIER_MEDIA_S3_SECRET_ACCESS_KEY must be set together",
            )
        if common.env == "prod" and backend == "local":
            reader.require(
                settings.url_secret != DEV_URL_SECRET, "MEDIA_URL_SECRET", "must be set in prod"
            )
        reader.finish()
        return settings

"""TLS for gRPC from PEM files: a listener's certificate, re-read when its files change,
and the credentials of a channel that dials such a listener.

A listener's credentials are grpc's dynamic server credentials: at every TLS handshake
grpc asks :meth:`ReloadingCertificate.fetch`, which looks at the files' stat (no read
while they are unchanged) and, once they changed, loads the new pair. A pair that does
not load — half written, a key that is not the certificate's — leaves the one in use
serving and is logged once per change, so a rotation that writes the two files one after
the other never takes the listener down. A renewed certificate (cert-manager updating a
mounted Secret) is in use from the next connection, without a restart; connections open
before keep the certificate they were made with.

With ``client_ca`` set the listener asks every client for a certificate signed by it
(mutual TLS); the same reload covers that file.
"""

from __future__ import annotations

import datetime
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import Gauge

from services.kit.logging import get_logger
from services.kit.settings import EnvReader, SettingsError

log = get_logger(__name__)

CERTIFICATE_EXPIRY = Gauge(
    "atelier_tls_certificate_expiry_timestamp_seconds",
    "Unix time at which the certificate a TLS listener serves expires",
    ["listener"],
)


class CertificateError(SettingsError):
    """A certificate, key or CA file cannot be used (a bad setting: the process stops
    at start); the message names the file, never its contents."""


@dataclass(frozen=True)
class ServerCertificateFiles:
    """Where a listener's TLS material lives: the certificate chain (leaf first) and its
    private key, both PEM; ``client_ca`` (PEM) makes client certificates required."""

    certificate: Path
    key: Path
    client_ca: Path | None = None

    def paths(self) -> tuple[Path, ...]:
        return (self.certificate, self.key, *((self.client_ca,) if self.client_ca else ()))


@dataclass(frozen=True)
class LoadedCertificate:
    """A pair that was checked to belong together, as the bytes grpc takes."""

    chain: bytes
    key: bytes
    client_ca: bytes | None
    not_after: datetime.datetime
    subject: str

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.key, self.chain)], root_certificates=self.client_ca
        )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read the {what} {path} ({error.strerror})") from None


def read_certificates(path: Path, what: str) -> list[x509.Certificate]:
    """Every certificate in a PEM file (at least one), or CertificateError."""
    data = _read(path, what)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(f"the {what} {path} holds no PEM certificate") from None
    return certificates


def load(files: ServerCertificateFiles) -> LoadedCertificate:
    """The pair (and client CA) from ``files``, checked: each parses, the key is the leaf
    certificate's. CertificateError otherwise."""
    chain = read_certificates(files.certificate, "certificate")
    key_data = _read(files.key, "key")
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError):
        # TypeError: an encrypted key (grpc cannot be given its password).
        raise CertificateError(
            f"the key {files.key} is not an unencrypted PEM private key"
        ) from None
    leaf = chain[0]
    if _public_bytes(key.public_key()) != _public_bytes(leaf.public_key()):
        raise CertificateError(
            f"the key {files.key} is not the key of the certificate {files.certificate}"
        )
    client_ca = None
    if files.client_ca is not None:
        read_certificates(files.client_ca, "client CA")
        client_ca = _read(files.client_ca, "client CA")
    return LoadedCertificate(
        chain=_read(files.certificate, "certificate"),
        key=key_data,
        client_ca=client_ca,
        not_after=leaf.not_valid_after_utc,
        subject=leaf.subject.rfc4514_string(),
    )


def _public_bytes(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


_Signature = tuple[tuple[int, int, int], ...]


def _signature(files: ServerCertificateFiles) -> _Signature:
    """What changes when any of the files is replaced or rewritten (a Kubernetes Secret
    volume swaps a symlink, which changes the inode; an edit changes mtime and size)."""
    stats = []
    for path in files.paths():
        try:
            stat = os.stat(path)
        except OSError:
            stats.append((-1, -1, -1))
            continue
        stats.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return tuple(stats)


class ReloadingCertificate:
    """A listener's certificate that follows its files. Built from files that load (or
    CertificateError); :meth:`credentials` are the server credentials to listen with."""

    def __init__(self, files: ServerCertificateFiles, listener: str = "tls") -> None:
        self.files = files
        self._lock = threading.Lock()
        self._seen = _signature(files)
        self.current = load(files)
        self.reloads = 0
        # What an alert reads to ask for a renewal before clients refuse the listener.
        self._expiry = CERTIFICATE_EXPIRY.labels(listener=listener)
        self._expiry.set(self.current.not_after.timestamp())

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.current.configuration(),
            # grpc documents None as "keep the current"; grpc-stubs leaves it out.
            self.fetch,  # type: ignore[arg-type]
            require_client_authentication=self.files.client_ca is not None,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's certificate fetcher, called on its own threads at each handshake: the
        new configuration once the files changed and load, else None (keep the current).
        It must never raise: grpc would fail the handshake."""
        try:
            return self._fetch()
        except Exception:
            log.exception("tls_certificate_reload_crashed", certificate=str(self.files.certificate))
            return None

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        signature = _signature(self.files)
        if signature == self._seen:
            return None
        with self._lock:
            if signature == self._seen:
                return None
            # Remembered whether it loads or not: a bad pair is tried again only after
            # the files change again (the second half of a rotation), not at every
            # handshake.
            self._seen = signature
            try:
                loaded = load(self.files)
            except CertificateError as error:
                log.warning(
                    "tls_certificate_reload_refused",
                    certificate=str(self.files.certificate),
                    problem=str(error),
                    keeping=self.current.subject,
                )
                return None
            self.current = loaded
            self.reloads += 1
            self._expiry.set(loaded.not_after.timestamp())
        log.info(
            "tls_certificate_reloaded",
            certificate=str(self.files.certificate),
            subject=loaded.subject,
            not_after=loaded.not_after.isoformat(),
        )
        return loaded.configuration()


def read_server_files(
    reader: EnvReader, cert_name: str, key_name: str, client_ca_name: str | None = None
) -> ServerCertificateFiles | None:
    """A listener's TLS files from settings: both the certificate and the key, or
    neither (None: the listener is off). The files must load now (a typo or a wrong
    key stops the process at start, naming the setting)."""
    certificate = reader.string(cert_name, "")
    key = reader.string(key_name, "")
    client_ca = reader.string(client_ca_name, "") if client_ca_name else ""
    if not certificate and not key:
        reader.require(not client_ca, str(client_ca_name), f"needs ATELIER_{cert_name}")
        return None
    reader.require(bool(certificate), cert_name, f"must be set with ATELIER_{key_name}")
    reader.require(bool(key), key_name, f"must be set with ATELIER_{cert_name}")
    if not certificate or not key:
        return None
    files = ServerCertificateFiles(
        Path(certificate), Path(key), Path(client_ca) if client_ca else None
    )
    try:
        load(files)
    except CertificateError as error:
        reader.require(False, cert_name, f"cannot be used: {error}")
        return None
    return files


def channel_credentials(
    ca: Path | None, client: tuple[Path, Path] | None = None
) -> grpc.ChannelCredentials:
    """Credentials of a channel to a TLS listener: the server's certificate must chain to
    ``ca`` (PEM; None: the system's roots); ``client`` is (certificate, key) for mutual
    TLS. CertificateError when a file cannot be used."""
    roots = None
    if ca is not None:
        read_certificates(ca, "CA")
        roots = _read(ca, "CA")
    chain = key = None
    if client is not None:
        pair = load(ServerCertificateFiles(client[0], client[1]))
        chain, key = pair.chain, pair.key
    return grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=key, certificate_chain=chain
    )

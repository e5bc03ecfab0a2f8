"""Mutual TLS on the internal listeners, as an option (ATELIER_INTERNAL_TLS_*).

Each process holds one certificate and key (``ATELIER_INTERNAL_TLS_CERT``, ``_KEY``) and
the CA that signs every internal certificate (``ATELIER_INTERNAL_TLS_CA``). Its internal
listener serves that certificate and requires a client certificate signed by the CA; its
clients dial peers' internal listeners presenting the same certificate and trusting only
that CA. The service credential (ATELIER_SERVICE_IDENTITIES) is still required on every
call: TLS says which machine, the credential which identity and what it may call.

The listener's files are re-read when they change (services.kit.tls); a client's are read
when its process starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from services.kit.tls import ServerCertificateFiles, channel_credentials, read_server_files

if TYPE_CHECKING:
    from services.kit.settings import EnvReader

LISTENER = "internal"


def read_internal_tls(reader: EnvReader) -> ServerCertificateFiles | None:
    """The internal listeners' TLS files, None when mTLS is off (no certificate, no key,
    no CA). A certificate without the CA is refused: the option is mutual TLS."""
    files = read_server_files(reader, "INTERNAL_TLS_CERT", "INTERNAL_TLS_KEY", "INTERNAL_TLS_CA")
    if files is not None:
        reader.require(
            files.client_ca is not None,
            "INTERNAL_TLS_CA",
            "must be set with ATELIER_INTERNAL_TLS_CERT (internal TLS is mutual: the CA "
            "that signs every internal certificate)",
        )
    return files


def client_credentials(files: ServerCertificateFiles | None) -> grpc.ChannelCredentials | None:
    """What a client of the internal listeners dials with; None: plaintext."""
    if files is None:
        return None
    return channel_credentials(files.client_ca, (files.certificate, files.key))

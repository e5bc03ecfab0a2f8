"""Acting for a user without impersonating them: an app backend whose identity has
``act_for_users`` (ATELIER_SERVICE_IDENTITIES) calls the public RPCs with its own
credential and names the user in :data:`ON_BEHALF_OF_HEADER`. The call runs as that user;
the principal keeps the backend's name (``identity``), so what the call changes records
both. Nobody but the identity provider needs a key that signs users."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from services.kit.auth import (
    PRINCIPAL_ID_RULE,
    JwtAuthenticator,
    Metadata,
    Principal,
    bearer_credential,
    principal_id_problem,
)
from services.kit.errors import ApiError, FieldViolation, Reason, invalid_argument
from services.kit.identities import ServiceIdentity, holder
from services.kit.jwks import IssuerKeys

# Not x-atelier-*: the edge strips those from clients (only our own services set them);
# this one a caller sets, and it means nothing without an identity allowed to send it.
ON_BEHALF_OF_HEADER = "atelier-on-behalf-of"


def _values(metadata: Metadata, name: str) -> list[str]:
    return [
        value.decode(errors="replace") if isinstance(value, bytes) else value
        for key, value in metadata
        if key == name
    ]


def not_permitted(message: str, identity: str = "") -> ApiError:
    return ApiError(
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.ON_BEHALF_OF_NOT_PERMITTED,
        message,
        metadata={"identity": identity} if identity else {},
    )


@dataclass(frozen=True)
class PublicAuthenticator:
    """Users by their tokens (``users``); with the on-behalf-of header, a backend identity
    that may act for users. The header is never ignored: from anyone else it is refused."""

    users: JwtAuthenticator
    identities: tuple[ServiceIdentity, ...] = ()

    @property
    def keys(self) -> IssuerKeys | None:
        return self.users.keys

    def authenticate(self, metadata: Metadata) -> Principal:
        named = _values(metadata, ON_BEHALF_OF_HEADER)
        if not named:
            return self.users.authenticate(metadata)
        credential = bearer_credential(metadata)
        identity = holder(self.identities, credential) if credential else None
        if identity is None:
            # A user token (checked first: a bad one gets its own reason) cannot speak
            # for another user.
            self.users.authenticate(metadata)
            raise not_permitted(f"a user token cannot be used with {ON_BEHALF_OF_HEADER}")
        if not identity.act_for_users:
            raise not_permitted(
                f"the identity {identity.name!r} may not act for users", identity.name
            )
        if len(named) != 1 or principal_id_problem(named[0].strip()) is not None:
            # The value is not echoed: it may be anything.
            raise invalid_argument(
                Reason.ON_BEHALF_OF_INVALID,
                [
                    FieldViolation(
                        ON_BEHALF_OF_HEADER,
                        PRINCIPAL_ID_RULE if len(named) == 1 else "must be sent once",
                    )
                ],
            )
        return Principal(user_id=named[0].strip(), identity=identity.name, role=identity.role)

"""The dev stack's service identities: one fresh credential per calling identity, as a
deployment has (ATELIER_SERVICE_IDENTITIES with their hashes; each service sends its own
as ATELIER_SERVICE_CREDENTIAL). The shared development token stays accepted beside them,
set explicitly, for `atelier token --service`, grpcurl examples and older tests."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field

from services.kit.identities import WATCH_ALL_JOBS, entry
from services.kit.settings import DEV_SERVICE_TOKEN

# The operator and the app backend a developer (or a test) calls as.
DEV_OPERATOR = "dev-operator"
DEV_BACKEND = "dev-backend"


def _fresh() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class StackCredentials:
    creation: str = field(default_factory=_fresh)
    notify: str = field(default_factory=_fresh)
    operator: str = field(default_factory=_fresh)
    backend: str = field(default_factory=_fresh)

    def identities(self) -> str:
        return json.dumps(
            [
                entry("creation", "creation", (self.creation,)),
                entry("notify", "notify", (self.notify,)),
                entry(DEV_OPERATOR, "operator", (self.operator,)),
                entry(
                    DEV_BACKEND,
                    "backend",
                    (self.backend,),
                    act_for_users=True,
                    allow=(WATCH_ALL_JOBS,),
                ),
            ]
        )

    def env(self, service: str) -> dict[str, str]:
        """What ``service``'s process reads, unless the environment configures identities
        itself."""
        if "ATELIER_SERVICE_IDENTITIES" in os.environ:
            return {}
        own = {"creation": self.creation, "notify": self.notify}.get(service)
        return {
            "ATELIER_SERVICE_IDENTITIES": self.identities(),
            "ATELIER_SERVICE_TOKEN": os.environ.get("ATELIER_SERVICE_TOKEN", DEV_SERVICE_TOKEN),
            **({"ATELIER_SERVICE_CREDENTIAL": own} if own else {}),
        }

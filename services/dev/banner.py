"""What `atelier dev` prints once everything answers: the addresses, a development token
and commands that paste into bash as they are (absolute tool paths, this run's ports)."""

from __future__ import annotations

from services.dev.credentials import DEV_BACKEND, DEV_OPERATOR, StackCredentials
from services.dev.processes import venv_binary
from services.dev.stack import StackPorts


def banner(ports: StackPorts, token: str, credentials: StackCredentials) -> str:
    edge = f"127.0.0.1:{ports.envoy}"
    creation = f"127.0.0.1:{ports.public['creation']}"
    admin = f"127.0.0.1:{ports.internal['creation']}"
    grpcurl = venv_binary("grpcurl")
    return f"""
atelier is running.
  edge (HTTP/JSON and gRPC)  http://{edge}
  web playground             http://{edge}/#token={token}
  creation (gRPC)            {creation} (internal {admin})
  media (gRPC)               127.0.0.1:{ports.public["media"]}
  media objects (HTTP)       127.0.0.1:{ports.media_http} (signed URLs, also via the edge)
  notify (gRPC)              127.0.0.1:{ports.public["notify"]}
  operator's console         http://127.0.0.1:{ports.console} (sign in: {DEV_OPERATOR} below)

development token (user dev-user, 24 h):
  export TOKEN={token}
this run's service identities (docs/operations.md, "Service identities"):
  {DEV_OPERATOR} (AdminService)       {credentials.operator}
  {DEV_BACKEND} (acts for users, job feed) {credentials.backend}

try (each command pastes into bash as is, after the export above):
  curl -s -H "authorization: Bearer $TOKEN" http://{edge}/v1/catalog
  curl -s -H "authorization: Bearer $TOKEN" -H "content-type: application/json" \\
    -d '{{"purpose": "ASSET_PURPOSE_AI_INPUT", "contentType": "image/jpeg", "sizeBytes": 1234}}' \\
    http://{edge}/v1/uploads
  {grpcurl} -plaintext -H "authorization: Bearer $TOKEN" \\
    {creation} atelier.creation.v1.CreationService/ListCatalog
  {grpcurl} -plaintext {creation} list
  {grpcurl} -plaintext {creation} describe atelier.creation.v1.CreationService.SubmitJob
  {grpcurl} -plaintext -H "authorization: Bearer {credentials.operator}" \\
    -d '{{"user_id": "dev-user", "amount": 50, "request_id": "dev-bonus"}}' \\
    {admin} atelier.creation.v1.AdminService/GrantPoints
  curl -s -H "authorization: Bearer {credentials.backend}" -H "atelier-on-behalf-of: dev-user" \\
    http://{edge}/v1/balance

Ctrl-C stops everything.
"""

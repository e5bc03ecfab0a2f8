"""A small JWKS-serving identity provider, as a process of its own, for the cases the
real OIDC provider (oidc-provider-mock) cannot play: several keys with kids, a rotation
with overlap, a given Cache-Control, an outage (SIGSTOP) while its keys are cached.

It serves ``/.well-known/openid-configuration`` (naming itself as issuer) and ``/jwks``
from a JSON file re-read on every request, so a test rotates keys by rewriting the file::

    {"keys": [<public JWK>, ...], "max_age": 300}

``/stats`` counts the requests it answered: ``{"discovery": n, "jwks": n}``.

    python -m tests.support.jwks_server PORT STATE_FILE
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_counts = {"discovery": 0, "jwks": 0}
_lock = threading.Lock()


def write_state(path: Path, keys: list[dict[str, Any]], max_age: int | None = None) -> None:
    """Replaces the key set atomically (the server never reads half a file)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"keys": keys, "max_age": max_age}))
    os.replace(temporary, path)


def main(port: int, state: Path) -> None:
    issuer = f"http://127.0.0.1:{port}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers: dict[str, str] = {}
            if self.path == "/.well-known/openid-configuration":
                with _lock:
                    _counts["discovery"] += 1
                body: Any = {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}
            elif self.path == "/jwks":
                with _lock:
                    _counts["jwks"] += 1
                document = json.loads(state.read_text())
                body = {"keys": document["keys"]}
                if document.get("max_age") is not None:
                    headers["cache-control"] = f"public, max-age={document['max_age']}"
            elif self.path == "/stats":
                with _lock:
                    body = dict(_counts)
            else:
                self.send_error(404)
                return
            payload = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))

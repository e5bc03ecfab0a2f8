"""The bearer token every call carries: a fixed string, or a callable asked before each
call (for tokens that expire and are refreshed elsewhere)."""

from __future__ import annotations

from collections.abc import Callable

Token = str | Callable[[], str]
Metadata = tuple[tuple[str, str], ...]


class BearerToken:
    __slots__ = ("_fixed", "_fresh")

    def __init__(self, token: Token) -> None:
        self._fresh: Callable[[], str] | None = None
        self._fixed: Metadata = ()
        if callable(token):
            self._fresh = token
        else:
            # Built once: a fixed token costs nothing per call.
            self._fixed = (("authorization", f"Bearer {token}"),)

    def metadata(self) -> Metadata:
        if self._fresh is None:
            return self._fixed
        return (("authorization", f"Bearer {self._fresh()}"),)

"""Where the database driver's errors become notify's: the kit's one boundary
(services/kit/outages.py ``database_failures``) names an outage or contention as
:class:`~services.notify.errors.DatabaseFailed`; any other failure (a bug, a
constraint) passes unchanged. Every public store method runs inside it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from services.kit.outages import database_failures
from services.notify.errors import DatabaseFailed

_P = ParamSpec("_P")
_T = TypeVar("_T")


def database(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Runs ``method`` inside the kit's database boundary."""

    @functools.wraps(method)
    async def answered(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with database_failures(DatabaseFailed):
            return await method(*args, **kwargs)

    return answered

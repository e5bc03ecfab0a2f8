"""Where the database driver's errors become notify's: a database that does not answer
(the kit's one classification of outages, services/kit/outages.py) is
:class:`~services.notify.errors.DatabaseUnavailable`; any other failure (a bug, a
constraint) passes unchanged. Every public store method runs inside it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from services.kit.errors import DomainError
from services.kit.outages import classify
from services.notify.errors import DatabaseUnavailable

_P = ParamSpec("_P")
_T = TypeVar("_T")


@contextmanager
def answering() -> Iterator[None]:
    try:
        yield
    except DomainError:
        raise  # already notify's (a store method calling another, a not-found)
    except Exception as error:
        outage = classify(error)
        if outage is None:
            raise
        raise DatabaseUnavailable(outage) from error


def database(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Runs ``method`` inside :func:`answering`."""

    @functools.wraps(method)
    async def answered(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with answering():
            return await method(*args, **kwargs)

    return answered

"""pytrio's own ``APIFuture``, already settled.

The fake computes everything at call time, so a future is either done with a value or done
with an exception. Using the real ``APIFuture`` (not a look-alike) guarantees that
``.result()``, ``await fut`` and ``.done()`` behave exactly as on the service.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TypeVar

from pytrio.types import APIFuture

T = TypeVar("T")


def completed(value: T) -> APIFuture[T]:
    return APIFuture.completed(value)


def failed(error: BaseException) -> APIFuture[T]:
    """A future whose ``.result()`` and ``await`` raise ``error`` (a server-side failure)."""
    future: Future[T] = Future()
    future.set_exception(error)
    return APIFuture(future)

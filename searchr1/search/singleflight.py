"""Single-flight: concurrent calls with the same key share one in-flight request.

The eight trajectories of a GRPO group often open with the same query; only the first
caller (the leader) runs the request, the others await its outcome. The shared work runs in
its own task, shielded, so one caller being cancelled does not cancel it for the others.

With ``remember=True`` a key's value also answers every later call of that key, once its
work has returned: the work then runs once per key for the flight's lifetime, however the
calls interleave (a call joins the request in flight, or takes the value it left). Work that
raised is not remembered; the next call runs it again.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self, *, remember: bool = False) -> None:
        self._inflight: dict[str, asyncio.Task[T]] = {}
        self._values: dict[str, T] | None = {} if remember else None

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """Run ``work()`` once per key at a time. Returns ``(value, shared)``, where
        ``shared`` is true for callers that joined someone else's request (or, remembering,
        took the value it returned). Exceptions from ``work`` reach every caller that joined it."""
        if self._values is not None and key in self._values:
            return self._values[key], True
        task = self._inflight.get(key)
        shared = task is not None
        if task is None:
            task = asyncio.ensure_future(work())
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        return await asyncio.shield(task), shared

    def _forget(self, key: str, task: asyncio.Task[T]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if task.cancelled():
            return
        # reading the exception marks it retrieved: callers got it through the shield
        if task.exception() is None and self._values is not None:
            self._values[key] = task.result()

    def __len__(self) -> int:
        return len(self._inflight)

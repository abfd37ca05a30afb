"""An asyncio event loop on virtual time: when every task waits on a timer, time jumps.

``asyncio.sleep``, ``asyncio.timeout`` and ``wait_for`` read ``loop.time()``; here that is a
counter that only moves when the loop would otherwise block, and then straight to the next
timer. Local CPU work therefore costs no (virtual) time, and a simulated step's makespan is
exactly what its scheduling policy makes of the simulated latencies, on any machine.

Only for code that waits on timers and in-process futures (the simulated services); real I/O
is polled without blocking, and a loop with nothing scheduled blocks as usual.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector:
    def __init__(self, selector: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._selector = selector
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            return self._selector.select(None)
        events = self._selector.select(0)
        if not events and timeout > 0:
            self._loop.advance(timeout)
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._selector, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0
        self._selector = _JumpingSelector(self._selector, self)  # type: ignore[assignment]

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(main: Awaitable[T]) -> tuple[T, float]:
    """Run ``main`` on a fresh virtual-time loop; return its result and the virtual seconds."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        loop = runner.get_loop()
        start = loop.time()
        result = runner.run(main)  # type: ignore[arg-type]
        return result, loop.time() - start

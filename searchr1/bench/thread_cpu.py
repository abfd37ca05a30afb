"""CPU time per thread, and of another process, for the benchmarks.

``time.process_time()`` sums every thread of the process, so a figure built on it cannot say
whose time it was (our engine on the main thread, pytrio's client on its own event-loop
thread, a twin served in this process), and wall time counts waiting. Linux keeps the CPU time
of every thread in ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds actually run; a thread
that sleeps, waits on a lock or blocks in ``select`` adds nothing), which is what this reads.
Where ``/proc`` is missing (not Linux) :func:`available` is false and a snapshot holds the
process total under the main thread, with the other threads folded into it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_PROC = "/proc"


def main_thread_id() -> int:
    """The native id of this process's main thread (it runs, so it has one)."""
    native_id = threading.main_thread().native_id
    assert native_id is not None
    return native_id


def available() -> bool:
    return os.path.exists(f"{_PROC}/self/task/{threading.get_native_id()}/schedstat")


def _read_schedstat(path: str) -> float | None:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None  # the thread ended between listing and reading


def thread_seconds(pid: int | str = "self") -> dict[int, float]:
    """CPU seconds of every live thread of ``pid``, by native thread id (empty without /proc)."""
    base = f"{_PROC}/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    out = {}
    for tid in tids:
        seconds = _read_schedstat(f"{base}/{tid}/schedstat")
        if seconds is not None:
            out[int(tid)] = seconds
    return out


def process_seconds(pid: int) -> float:
    """User and system CPU seconds of another process so far, its ended threads included
    (``/proc/<pid>/stat``, in clock ticks: a twin serving each connection on a thread of its own
    would lose every ended thread's time from a sum over its live threads); 0 when it is gone or
    unreadable."""
    try:
        with open(f"{_PROC}/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass(frozen=True)
class CpuSnapshot:
    threads: Mapping[int, float]
    others: Mapping[int, float] = field(default_factory=dict)  # other processes, by pid


@dataclass(frozen=True)
class CpuInterval:
    """CPU seconds spent between two snapshots, by role."""

    roles: Mapping[str, float]
    processes: Mapping[int, float]

    def total(self, roles: Iterable[str]) -> float:
        return sum(self.roles.get(role, 0.0) for role in roles)


class ThreadCpuMeter:
    """Snapshots of this process's threads (and of other processes, e.g. a served twin).

    ``roles`` maps a native thread id to a role name (``"main"``, ``"client"``, ...); a thread
    not named there is ``"other"``, and a thread started after the first snapshot counts from
    zero. ``pids`` are other processes whose whole CPU is reported separately.
    """

    def __init__(self, roles: Mapping[int, str] | None = None, pids: Iterable[int] = ()) -> None:
        self.roles = dict(roles or {main_thread_id(): "main"})
        self.pids = list(pids)
        self.proc = available()

    def snapshot(self) -> CpuSnapshot:
        if not self.proc:
            main = next((tid for tid, role in self.roles.items() if role == "main"), 0)
            return CpuSnapshot({main: time.process_time()})
        return CpuSnapshot(thread_seconds(), {pid: process_seconds(pid) for pid in self.pids})

    def interval(self, start: CpuSnapshot, end: CpuSnapshot) -> CpuInterval:
        roles: dict[str, float] = {}
        for tid, seconds in end.threads.items():
            spent = seconds - start.threads.get(tid, 0.0)
            role = self.roles.get(tid, "other")
            roles[role] = roles.get(role, 0.0) + max(0.0, spent)
        processes = {pid: max(0.0, end.others.get(pid, 0.0) - start.others.get(pid, 0.0)) for pid in end.others}
        return CpuInterval(roles, processes)


def loop_thread_id(loop: object) -> int | None:
    """Native id of the thread running asyncio ``loop`` (another thread's), or ``None``."""
    import asyncio

    if not isinstance(loop, asyncio.AbstractEventLoop) or not loop.is_running():
        return None

    async def ask() -> int:
        return threading.get_native_id()

    try:
        return asyncio.run_coroutine_threadsafe(ask(), loop).result(timeout=5.0)
    except Exception:  # noqa: BLE001 - a closed or stuck loop: the role stays "other"
        return None


def pytrio_client_thread_id(service_client: object) -> int | None:
    """Native id of the event-loop thread a ``pytrio.ServiceClient`` runs its transport on.

    pytrio 0.2.9 keeps it at ``_runtime.event_loop.loop`` (private; ``None`` if that moves)."""
    runtime = getattr(service_client, "_runtime", None)
    runner = getattr(runtime, "event_loop", None)
    try:
        loop = getattr(runner, "loop", None)
    except RuntimeError:
        return None
    return loop_thread_id(loop)


def client_thread_roles(service_client: object) -> dict[int, str]:
    """The roles of a process that drives ``service_client``: our main thread (``"main"``) and
    pytrio's event-loop thread (``"client"``, left out when it cannot be found)."""
    roles = {main_thread_id(): "main"}
    client = pytrio_client_thread_id(service_client)
    if client is not None:
        roles[client] = "client"
    return roles

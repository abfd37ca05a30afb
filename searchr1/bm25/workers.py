"""``retriever serve --workers N``: several processes answer from one index on one port.

The parent opens the index (memory-mapped: its arrays are the files' pages, which the kernel
keeps once in its page cache however many processes map them), binds one listening socket per
worker on the one port (``SO_REUSEPORT``), and forks ``N`` workers. Each worker runs the same
server as a single process does (its own event loop, its own query batcher, the same bounds per
worker) on its own socket, and the kernel spreads new connections over the sockets by a hash of
the client's address (one socket shared by every worker gave most connections to one of them: on
two cores, one worker busy 80% of the time, the other 28%). Memory beyond the page cache is
therefore what one server needs, times ``N``.

The parent only supervises: SIGINT or SIGTERM stops every worker and waits for it (Ctrl-C then
exits 130, as every command does); a worker that exits on its own stops the others, and the
command fails with one line naming it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

STOP_GRACE = 10.0  # seconds a worker gets to finish its requests after SIGTERM, then SIGKILL


class WorkerExited(RuntimeError):
    """A worker process ended while the server was meant to run."""


def serve_in_workers(run: Callable[[socket.socket], None], sockets: Sequence[socket.socket]) -> None:
    """Run ``run(sock)`` for each of ``sockets`` in a forked process of its own, until a signal or a
    worker's exit."""
    context = multiprocessing.get_context("fork")  # the workers share the parent's mapped index
    processes = [context.Process(target=_worker, args=(run, sock), name=f"retriever-worker-{n}", daemon=True)
                 for n, sock in enumerate(sockets)]
    stopping = 0  # the signal that stops the server

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = signum

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for process in processes:
            process.start()
        while not stopping:
            ended = next((p for p in processes if not p.is_alive()), None)
            if ended is not None and not stopping:  # a worker stopped by Ctrl-C is no failure
                raise WorkerExited(f"retriever worker {ended.name} (pid {ended.pid}) exited with code "
                                   f"{ended.exitcode}; the other workers were stopped")
            time.sleep(0.2)
    finally:
        _stop_all(processes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping == signal.SIGINT:
        raise KeyboardInterrupt  # Ctrl-C ends the command as it ends every other (exit 130)


def _worker(run: Callable[[socket.socket], None], sock: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop (SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    code = 0
    try:
        run(sock)
    except KeyboardInterrupt:
        pass
    except Exception as error:  # noqa: BLE001 - one line from the worker; the parent names it and stops
        first = str(error).splitlines()[0][:200] if str(error) else "no message"
        print(f"retriever worker {os.getpid()}: {type(error).__name__}: {first}", file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


def _stop_all(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: uvicorn finishes its requests and exits
    deadline = time.monotonic() + STOP_GRACE
    for process in processes:
        if process.pid is None:
            continue
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()

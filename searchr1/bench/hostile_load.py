"""A bounded hostile load on a server of ours (``retriever serve`` or the twin), on 127.0.0.1:
large uploads at once plus many slow clients that send one header line every few seconds. It
stops by itself (when every client has its answer or was dropped, or at ``run_for``) and
reports the server's peak RSS over its idle RSS and how long the slowest slow client was held.

The server runs in a child process (``python -m searchr1.bench.hostile_load serve ...``), so
the RSS measured is the server's alone; :func:`measure` starts it, loads it and stops it.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20


@dataclass(frozen=True)
class LoadShape:
    """How hard to push. The defaults are the full load; the suite runs a smaller one."""

    uploads: int = 8  # concurrent uploads
    upload_bytes: int = 100 * MIB  # each upload's body
    slow_clients: int = 300  # connections sending one header line every ``header_every`` seconds
    header_every: float = 2.0
    run_for: float = 60.0  # the load stops by itself after this many seconds at most


@dataclass
class LoadReport:
    idle_rss: int  # bytes, before the load
    peak_rss: int  # bytes, the highest seen during the load
    upload_answers: list[str] = field(default_factory=list)  # each upload's status line ("closed": none)
    slow_dropped: int = 0  # slow clients the server dropped
    slow_held: int = 0  # slow clients still connected when the load stopped
    slowest_drop: float = 0.0  # seconds the longest-held dropped slow client was kept
    seconds: float = 0.0

    @property
    def rss_growth(self) -> int:
        return self.peak_rss - self.idle_rss


def rss_of(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _upload(port: int, head: bytes, size: int, chunked: bool, until: float, answers: list[str]) -> None:
    block = b" " * MIB
    framed = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    answer = "closed"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(head)
            connection.setblocking(False)
            sent, pending, received = 0, b"", b""
            while time.monotonic() < until:
                if not pending and sent < size:
                    pending, sent = (framed if chunked else block[: size - sent]), sent + min(MIB, size - sent)
                    if chunked and sent >= size:
                        pending += b"0\r\n\r\n"
                try:
                    if pending:
                        pending = pending[connection.send(pending):]
                except BlockingIOError:
                    pass
                except OSError:
                    pending = b""
                    sent = size  # the server closed its side; read what it said
                try:
                    data = connection.recv(4096)
                    if not data:
                        break
                    received += data
                    if b"\r\n" in received:
                        break
                except BlockingIOError:
                    time.sleep(0.001 if pending else 0.01)
                except OSError:
                    break
            if received:
                answer = received.split(b"\r\n", 1)[0].decode("latin-1")
    except OSError:
        pass
    answers.append(answer)


def _slow_clients(port: int, shape: LoadShape, until: float, report: LoadReport) -> None:
    selector = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    for _ in range(shape.slow_clients):
        try:
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(b"POST /retrieve HTTP/1.1\r\n")
        except OSError:
            report.slow_dropped += 1  # refused at once
            continue
        connection.setblocking(False)
        opened[connection] = time.monotonic()
        selector.register(connection, selectors.EVENT_READ)
    next_line = time.monotonic() + shape.header_every
    while opened and time.monotonic() < until:
        for key, _ in selector.select(timeout=0.05):
            readable = key.fileobj
            assert isinstance(readable, socket.socket)  # only the sockets above are registered
            connection = readable
            try:
                data = connection.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # dropped (an answer before the drop is read and ignored)
                report.slowest_drop = max(report.slowest_drop, time.monotonic() - opened.pop(connection))
                report.slow_dropped += 1
                selector.unregister(connection)
                connection.close()
        if time.monotonic() >= next_line:
            next_line += shape.header_every
            for connection in list(opened):
                try:
                    connection.send(b"X-Slow: 1\r\n")
                except OSError:
                    pass  # seen as dropped by the next read
    report.slow_held = len(opened)
    for connection in opened:
        connection.close()
    selector.close()


def load(port: int, pid: int, *, upload_head: bytes, chunked: bool, shape: LoadShape) -> LoadReport:
    """Run ``shape`` against the server listening on ``port`` (process ``pid``)."""
    report = LoadReport(idle_rss=rss_of(pid), peak_rss=rss_of(pid))
    started = time.monotonic()
    until = started + shape.run_for
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            try:
                report.peak_rss = max(report.peak_rss, rss_of(pid))
            except (OSError, RuntimeError):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    workers = [threading.Thread(target=_upload, args=(port, upload_head, shape.upload_bytes, chunked, until,
                                                      report.upload_answers), daemon=True)
               for _ in range(shape.uploads)]
    workers.append(threading.Thread(target=_slow_clients, args=(port, shape, until, report), daemon=True))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0.0, until - time.monotonic()) + 5)
    done.set()
    sampler.join()
    report.seconds = time.monotonic() - started
    return report


def measure(kind: str, shape: LoadShape, *, request_timeout: float, body_budget: int,
            index: Path | None = None) -> LoadReport:
    """Start a ``kind`` server (``retriever`` over ``index``, or ``twin``) in a child process with
    the given request deadline (and, for the twin, total body budget, which is also its cap per
    body), load it with ``shape``, stop it."""
    command = [sys.executable, "-m", "searchr1.bench.hostile_load", "serve", kind,
               "--request-timeout", str(request_timeout), "--body-budget", str(body_budget)]
    if index is not None:
        command += ["--index", str(index)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        line = child.stdout.readline() if child.stdout else ""
        if not line.startswith("port "):
            raise RuntimeError(f"the {kind} server did not start (it said {line!r})")
        port = int(line.split()[1])
        if kind == "twin":
            head = (f"POST /api/openapi/v1/service-sessions HTTP/1.1\r\nHost: x\r\nX-API-Key: {line.split()[2]}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {shape.upload_bytes}\r\n\r\n").encode()
            return load(port, child.pid, upload_head=head, chunked=False, shape=shape)
        head = (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        return load(port, child.pid, upload_head=head, chunked=True, shape=shape)
    finally:
        if child.stdin:
            child.stdin.close()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _serve(kind: str, request_timeout: float, body_budget: int, index: str | None) -> None:
    """The child: serve on a free port, say ``port N [KEY]``, stop when stdin closes."""
    if kind == "retriever":
        from searchr1.bm25.index import BM25Index
        from searchr1.bm25.server import start_in_thread

        if index is None:
            raise SystemExit("--index is needed for the retriever")
        with start_in_thread(BM25Index(index), request_timeout=request_timeout) as server:  # its own body cap
            print(f"port {server.url.rsplit(':', 1)[1].split('/')[0]}", flush=True)
            sys.stdin.read()
        return
    import tempfile

    from searchr1.twin import start_twin

    with tempfile.TemporaryDirectory() as home, start_twin(
            home=Path(home), policy="toy", request_timeout=request_timeout, max_body_bytes=body_budget,
            max_total_body_bytes=body_budget) as twin:
        print(f"port {twin.base_url.rsplit(':', 1)[1]} {twin.api_key}", flush=True)
        sys.stdin.read()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m searchr1.bench.hostile_load")
    parser.add_argument("mode", choices=["serve", "load"])
    parser.add_argument("kind", choices=["retriever", "twin"])
    parser.add_argument("--index")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--body-budget", type=int, default=256 * MIB)
    parser.add_argument("--uploads", type=int, default=LoadShape.uploads)
    parser.add_argument("--upload-mib", type=int, default=LoadShape.upload_bytes // MIB)
    parser.add_argument("--slow-clients", type=int, default=LoadShape.slow_clients)
    parser.add_argument("--header-every", type=float, default=LoadShape.header_every)
    parser.add_argument("--run-for", type=float, default=LoadShape.run_for)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        _serve(args.kind, args.request_timeout, args.body_budget, args.index)
        return
    shape = LoadShape(uploads=args.uploads, upload_bytes=args.upload_mib * MIB, slow_clients=args.slow_clients,
                      header_every=args.header_every, run_for=args.run_for)
    report = measure(args.kind, shape, request_timeout=args.request_timeout, body_budget=args.body_budget,
                     index=Path(args.index) if args.index else None)
    print(f"{args.kind}: RSS {report.idle_rss / MIB:.0f} -> peak {report.peak_rss / MIB:.0f} MiB "
          f"(+{report.rss_growth / MIB:.0f}); uploads answered {sorted(set(report.upload_answers))}; "
          f"slow clients dropped {report.slow_dropped}, held {report.slow_held}, slowest drop "
          f"{report.slowest_drop:.1f} s; {report.seconds:.1f} s")


if __name__ == "__main__":
    main()

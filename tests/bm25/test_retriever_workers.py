"""`retriever serve --workers N`: N processes answer from one index on one port, and they stop
together (Ctrl-C, SIGTERM, or one of them dying) without a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from searchr1.bm25.index import BM25Index, build_index

pytestmark = pytest.mark.slow  # a server in processes of its own (seconds)

CLI = Path(__file__).resolve().parents[2] / "cli.py"
ROWS = [(f"T{i}", f"passage {i} about topic{i % 7} and word{i % 11}") for i in range(60)]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("workers")
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n"
                              for i, (title, text) in enumerate(ROWS)), "utf-8")
    build_index(corpus, directory / "index")
    return directory / "index"


def start(index_dir: Path, workers: int) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen([sys.executable, str(CLI), "retriever", "serve", "--index", str(index_dir),
                               "--port", "0", "--workers", str(workers)],
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = server.stderr.readline() if server.stderr else ""
    found = re.search(r"(http://127\.0\.0\.1:\d+/retrieve)", line)
    assert found, line
    deadline = time.monotonic() + 10
    while len(children(server.pid)) < workers and time.monotonic() < deadline:  # forked after the line
        time.sleep(0.05)
    return server, found.group(1)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def stopped(server: subprocess.Popen[str], *, timeout: float = 15.0) -> tuple[int, str]:
    code = server.wait(timeout=timeout)
    return code, server.stderr.read() if server.stderr else ""


def test_the_workers_answer_what_one_index_answers_and_stop_together_on_ctrl_c(index_dir):
    expected = BM25Index(index_dir).search([f"topic{i % 7} word{i % 11}" for i in range(40)], 3)
    server, url = start(index_dir, 3)
    try:
        assert len(children(server.pid)) == 3
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(
                lambda i: httpx.post(url, json={"queries": [f"topic{i % 7} word{i % 11}"], "topk": 3}, timeout=10),
                range(40)))
        assert all(answer.status_code == 200 for answer in answers)
        for answer, hits in zip(answers, expected):
            assert [item["id"] for item in answer.json()["result"][0]] == [hit.id for hit in hits]
        workers = children(server.pid)
        os.killpg(server.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        code, said = stopped(server)
        assert code == 130 and "Traceback" not in said
        time.sleep(0.2)
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                    and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def test_a_worker_that_dies_stops_the_others_with_one_line(index_dir):
    server, _ = start(index_dir, 2)
    try:
        first, *_ = children(server.pid)
        os.kill(first, signal.SIGKILL)
        code, said = stopped(server)
        assert code == 1 and "Traceback" not in said
        assert f"(pid {first}) exited" in said and len(said.strip().splitlines()) == 1
        assert children(server.pid) == []
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def test_each_worker_listens_on_a_socket_of_its_own_and_a_taken_port_is_refused_not_shared():
    import socket

    from searchr1.runtime.http_bounds import PortTakenError, listening_sockets

    sockets = listening_sockets("127.0.0.1", 0, 3)
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        assert len(sockets) == 3 and len(ports) == 1 and len({sock.fileno() for sock in sockets}) == 3
        assert all(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for sock in sockets)
        with pytest.raises(PortTakenError, match="is taken"):  # even by a server that shares its port
            listening_sockets("127.0.0.1", ports.pop(), 2)
    finally:
        for sock in sockets:
            sock.close()


def test_each_worker_process_serves_the_socket_given_to_it(tmp_path):
    """Worker n runs on socket n: every worker one socket, each socket one worker (with one
    socket shared by all, the kernel gave most connections to whichever worker woke first)."""
    from searchr1.bm25.workers import WorkerExited, serve_in_workers
    from searchr1.runtime.http_bounds import listening_sockets

    sockets = listening_sockets("127.0.0.1", 0, 3)
    given = sorted(sock.fileno() for sock in sockets)

    def run(sock) -> None:  # a worker that says which socket it got, then ends
        (tmp_path / str(os.getpid())).write_text(str(sock.fileno()))

    try:
        with pytest.raises(WorkerExited):  # a worker that ends stops the server
            serve_in_workers(run, sockets)
    finally:
        for sock in sockets:
            sock.close()
    served = sorted(int(path.read_text()) for path in tmp_path.iterdir())  # one file per worker process
    assert served == given

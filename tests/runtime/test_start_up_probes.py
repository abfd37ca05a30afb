"""The quick probes the start-up checks make: where PyTRIO is, read without importing the SDK
when ``PYTRIO_BASE_URL`` says it; whether its host refuses connections, waited for a bounded
time however the name lookup behaves; and a data file's first row, without reading the rest."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

import searchr1.runtime.connect as connect
from searchr1.data.dataset import DataError, first_example


def test_the_base_url_variable_is_read_without_importing_the_sdk():
    probe = ("import os, sys\n"
             "os.environ['PYTRIO_BASE_URL'] = ' http://127.0.0.1:9/ '\n"
             "from searchr1.runtime.connect import configured_base_url\n"
             "print(configured_base_url(), 'pytrio' in sys.modules)\n")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.split() == ["http://127.0.0.1:9", "False"]


def test_without_the_variable_the_sdk_says_where(monkeypatch):
    monkeypatch.delenv("PYTRIO_BASE_URL", raising=False)
    monkeypatch.setattr(connect, "pytrio_base_url", lambda: "https://profile.example")
    assert connect.configured_base_url() == "https://profile.example"


def test_a_refused_port_is_named_and_a_listening_one_is_not():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert connect.refused_within(f"http://127.0.0.1:{closed}") == (
        f"127.0.0.1:{closed} refused the connection (nothing listens there)")
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert connect.refused_within(f"http://127.0.0.1:{server.getsockname()[1]}") is None


def test_a_probe_that_hangs_is_given_up_after_its_timeout(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(connect, "refusal", lambda url, timeout: release.wait(30) and None)  # a hung lookup
    begun = time.monotonic()
    try:
        assert connect.refused_within("http://hangs.example:1", timeout=0.2) is None
        assert time.monotonic() - begun < 2
    finally:
        release.set()


def test_the_first_example_is_read_without_the_rest_of_the_file(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('\n{"id": "1", "question": "q?", "answers": ["a"], "data_source": "nq"}\nnot json\n')
    assert first_example(data).id == "1"
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert first_example(tmp_path / "empty.jsonl") is None
    (tmp_path / "bad.jsonl").write_text('{"id": "1"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field 'question'"):
        first_example(tmp_path / "bad.jsonl")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_connect_failure_is_named_whether_the_server_or_a_proxy_in_between_refuses(monkeypatch):
    for name in (*connect.PROXY_VARIABLES, *(n.lower() for n in connect.PROXY_VARIABLES)):
        monkeypatch.delenv(name, raising=False)
    assert connect.proxies_set() == []
    assert connect.connect_failure(f"http://127.0.0.1:{_closed_port()}").startswith("ConnectError: ")
    with socket.create_server(("127.0.0.1", 0)) as server:  # connects, never answers: left to the client
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert connect.connect_failure(url, timeout=0.2) is None
        monkeypatch.setenv("http_proxy", f"http://user:hunter2@127.0.0.1:{_closed_port()}")
        assert connect.proxies_set() == ["HTTP_PROXY"]
        failure = connect.connect_failure(url, timeout=0.2)
        assert failure is not None and failure.startswith("ConnectError: ") and "hunter2" not in failure

"""A twin the SDK cannot reach (a proxy variable that sends 127.0.0.1's requests to a proxy that is
not there) stops every offline command at once with one line that names the twin, the variables
and the fix, exit 1: never pytrio's half minute of retries and its traceback."""

from __future__ import annotations

import socket
import time

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.runtime.connect import PROXY_VARIABLES
from searchr1.twin.client import LOCAL_RETRIES


@pytest.fixture
def dead_proxy(monkeypatch) -> None:
    for name in (*PROXY_VARIABLES, *(n.lower() for n in PROXY_VARIABLES), "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: the proxy refuses connections
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("words", [
    ("export", "trio://twin/run-0001/weights/x-step-000001-weights", "--offline", "--offline-home", "{tmp}/home",
     "--out", "{tmp}/out"),
    ("train", "--offline", "--max-steps", "1", "--run-dir", "{tmp}/run"),
    ("eval", "--offline", "--limit", "1", "--output", "{tmp}/eval.jsonl"),
    ("ask", "who wrote pride and prejudice?", "--offline"),
], ids=lambda words: words[0])
def test_an_unreachable_twin_is_one_line_at_once(words, dead_proxy, tmp_path):
    (tmp_path / "home").mkdir()
    started = time.monotonic()
    result = CliRunner().invoke(main, [word.format(tmp=tmp_path) for word in words])
    waited = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: cannot connect to the offline twin at http://127.0.0.1:")
    assert "ALL_PROXY and HTTP_PROXY send requests through a proxy: add 127.0.0.1 to NO_PROXY" in errors[0]
    assert waited < LOCAL_RETRIES["control_retry_timeout_seconds"] / 3, f"{waited:.1f} s: the SDK's retries were waited out"

"""The offline twin in a process of its own, for the benchmarks: the service's CPU stays out of
the measured process, as it does live, and pytrio's client does all the local work it does live.

``served_twin(scenario_raw, latencies)`` writes the scenario, starts ``python -m searchr1.cli
twin serve`` with it and the modelled latencies, and yields a real ``pytrio.ServiceClient``
connected to it; the server is stopped (SIGTERM, then killed if it lingers) on exit.
``in_process=True`` (``bench --quick``, a smoke run whose numbers are not for quoting) starts
the twin in this process instead, which saves the second process's start-up.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.runtime.connect import sampling_capacity
from searchr1.wiring.services import SAMPLING_CONCURRENCY
from searchr1.twin.client import LOCAL_RETRIES, connect, session_closer
from searchr1.twin.config import Latencies
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from pytrio import ServiceClient

    from searchr1.twin.policy import TwinPolicy

BASE_MODEL = "Qwen/Qwen3.5-4B"


class TwinStartError(RuntimeError):
    """The twin process did not print its address."""


@contextmanager
def served_twin(scenario: Mapping[str, object] | None, latencies: Latencies = Latencies(), *, in_process: bool = False,
                tokenizer: Qwen35Tokenizer | None = None, policy: str = "scripted", max_staleness: int = 0,
                strict: bool = True, on_process: Callable[[int], None] | None = None,
                sampling_concurrency: int = SAMPLING_CONCURRENCY) -> Iterator[ServiceClient]:
    """``scenario`` is what the scripted policy replies from; other policies take ``None``.
    The client's sampling clients keep ``sampling_concurrency`` requests in flight, as
    ``train``'s do.
    ``max_staleness`` is the strict mode's allowance for off-policy training; ``strict=False``
    lets a run train on samples the twin did not serve (figure 5's in-memory sampler).
    ``on_process`` is told the server's process id (not called for ``in_process``)."""
    sdk_options = {**LOCAL_RETRIES, **sampling_capacity(sampling_concurrency)}
    if in_process:
        with _in_process(scenario, latencies, tokenizer, policy, max_staleness, strict,
                         sdk_options=sdk_options) as client:
            yield client
        return
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-twin-") as scratch:
        command = [sys.executable, "-m", "searchr1.cli", "twin", "serve", "--home", str(Path(scratch) / "home"),
                   "--policy", policy, "--max-staleness", str(max_staleness)]
        if not strict:
            command.append("--no-strict")
        if scenario is not None:
            path = Path(scratch) / "scenario.json"
            path.write_text(json.dumps(scenario), "utf-8")
            command += ["--scenario", str(path)]
        command += [
            "--sample-latency", repr(latencies.sample_request), "--token-latency", repr(latencies.sampled_token),
            "--train-token-latency", repr(latencies.trained_token), "--optim-latency", repr(latencies.optim_step),
            "--save-latency", repr(latencies.weight_save),
        ]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if on_process is not None:
                on_process(server.pid)
            first = server.stdout.readline().strip() if server.stdout else ""
            if not first.startswith("PYTRIO_BASE_URL="):
                raise TwinStartError(f"the twin did not start: {(first + server.communicate(timeout=30)[1])[-500:]}")
            client = connect(first.split("=", 1)[1], home=Path(scratch) / "sdk", sdk_options=sdk_options)
            closer = session_closer(client)
            try:
                yield client
            finally:
                closer()  # the session ends while the server still answers
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            for stream in (server.stdout, server.stderr):
                if stream is not None:
                    stream.close()


@contextmanager
def _in_process(scenario: Mapping[str, object] | None, latencies: Latencies, tokenizer: Qwen35Tokenizer | None,
                policy: str, max_staleness: int, strict: bool = True, *,
                sdk_options: Mapping[str, float]) -> Iterator[ServiceClient]:
    from searchr1.twin import Strictness, start_twin
    from searchr1.twin.scenario import parse_scenario
    from searchr1.twin.scripted_policy import ScriptedPolicy

    if tokenizer is None:
        from searchr1.runtime.tokenizer import shared_tokenizer

        tokenizer = shared_tokenizer()
    served: TwinPolicy | str = ScriptedPolicy(parse_scenario(scenario), tokenizer) if scenario is not None else policy
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-twin-") as scratch, \
            start_twin(home=scratch, tokenizer=tokenizer, policy=served, latencies=latencies,
                       strictness=Strictness(enabled=strict, max_staleness=max_staleness)) as twin:
        yield twin.service_client(sdk_options=sdk_options)

"""Starting and stopping a twin: ``with start_twin(home=..., policy=...) as twin: ...``.

``twin.base_url`` is what ``PYTRIO_BASE_URL`` would be; ``twin.service_client()`` is a real
``pytrio.ServiceClient`` connected to it. Everything the server knows that a test may want to
check is on the object: the policy, the sampling and event logs, the recorded strict-mode
violations. Stopping ends the clients it handed out, then the server (idempotent).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.twin.backend import EventLogEntry, SampleLogEntry, TwinBackend, TwinSettings
from searchr1.twin.client import LOCAL_RETRIES, TWIN_API_KEY, connect, session_closer
from searchr1.twin.config import Latencies, StopConvention, Strictness, TwinFaults, TwinLimits
from searchr1.twin.http_server import TwinHTTPServer
from searchr1.twin.policies import make_policy
from searchr1.twin.policy import Reduction, TwinPolicy
from searchr1.twin.served import ServedUsage
from searchr1.twin.served_tokenizer import served_tokenizer_dir
from searchr1.twin.strict import Violation
from searchr1.twin.training_run import Accumulation, TrainingRun

if TYPE_CHECKING:
    from pytrio import ServiceClient

    from searchr1.twin.scenario import Scenario

DEFAULT_MODEL = "Qwen/Qwen3.5-4B"

# Twins alive in this process (the test suite fails a test whose twin recorded a violation).
LIVE_TWINS: weakref.WeakSet[Twin] = weakref.WeakSet()
# Backends of twins already garbage-collected that hold violations nobody took.
_COLLECTED_WITH_VIOLATIONS: list[tuple[str, TwinBackend]] = []


def _keep_untaken(base_url: str, backend: TwinBackend) -> None:
    """Runs when a twin is garbage-collected, on whatever thread the collector runs: it takes
    no lock (a lock here could wait on a thread that waits on this one) and keeps the backend
    only when it holds violations, which :func:`untaken_violations` then takes."""
    if backend.violations:
        _COLLECTED_WITH_VIOLATIONS.append((base_url, backend))  # atomic under the GIL


def untaken_violations() -> list[str]:
    """Every violation recorded by any twin of this process and not taken yet, cleared: twins
    still alive and twins already collected alike (a test's twin may be gone by its teardown)."""
    collected = []
    while _COLLECTED_WITH_VIOLATIONS:
        collected.append(_COLLECTED_WITH_VIOLATIONS.pop(0))
    alive = [(twin.base_url, twin.backend) for twin in list(LIVE_TWINS)]
    return [f"{url}: {v}" for url, backend in collected + alive for v in backend.take_violations()]


class Twin:
    def __init__(self, backend: TwinBackend, server: TwinHTTPServer) -> None:
        self.backend = backend
        self._server = server
        self._closers: list[Callable[[], object]] = []  # one per client handed out; they hold no client alive
        self._lock = threading.Lock()
        self.closed = False

    # --- addresses and clients ----------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self._server.url

    @property
    def home(self) -> Path:
        return self.backend.settings.home

    @property
    def api_key(self) -> str:
        return self.backend.settings.api_key

    def service_client(self, *, sdk_options: Mapping[str, float] = LOCAL_RETRIES,
                       telemetry: bool = False) -> ServiceClient:
        """A real ``pytrio.ServiceClient`` for this twin (its SDK home lives in the twin's home)."""
        client = connect(self.base_url, home=self.home / "sdk-home", api_key=self.api_key,
                         telemetry=telemetry, sdk_options=sdk_options)
        with self._lock:
            self._closers.append(session_closer(client))
        return client

    def stop_with(self, client: ServiceClient) -> None:
        """Stop this twin once ``client`` and every client derived from it are gone (their
        session is closed first)."""
        weakref.finalize(client._runtime, self._close_from_finalizer)

    def _close_from_finalizer(self) -> None:
        """A garbage-collection finalizer can run on any thread at any point, even inside an
        import that other threads wait for; closing blocks on the SDK's event-loop threads, which
        may need that very import. So the close runs on a thread of its own - except at
        interpreter exit, when finalizers run one after another and no new thread may start."""
        if getattr(weakref.finalize, "_shutdown", False):
            self.close()
            return
        threading.Thread(target=self.close, name="searchr1-twin-close", daemon=True).start()

    # --- what the server saw ------------------------------------------------------------

    @property
    def policy(self) -> TwinPolicy:
        return self.backend.settings.policy

    @policy.setter
    def policy(self, policy: TwinPolicy) -> None:
        """Serve another model from now on (runs keep their params; kinds must match to load)."""
        self.backend.settings.policy = policy

    @property
    def served(self) -> ServedUsage:
        """What this twin answered so far (:mod:`searchr1.twin.served`)."""
        return self.backend.served.snapshot()

    @property
    def sample_log(self) -> list[SampleLogEntry]:
        return list(self.backend.sample_log)

    @property
    def event_log(self) -> list[EventLogEntry]:
        return list(self.backend.event_log)

    @property
    def violations(self) -> list[Violation]:
        return list(self.backend.violations)

    def calls(self, operation: str) -> int:
        """How many requests of ``operation`` (a :data:`~searchr1.twin.config.OPERATIONS` name)
        reached the twin, answered or not."""
        with self.backend._lock:
            return self.backend._counts[operation]

    def take_violations(self) -> list[Violation]:
        """The violations recorded so far, cleared (a test that expects them takes them)."""
        return self.backend.take_violations()

    def training_run(self, cuid: str) -> TrainingRun:
        """The server-side state of a live training run (params, optimiser, gradients)."""
        return self.backend._run(cuid)

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            closers, self._closers = self._closers, []
        for closer in closers:
            closer()
        self.backend.stop()
        self._server.stop()

    def __enter__(self) -> Twin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_twin(
    *,
    home: str | Path,
    policy: str | TwinPolicy = "scripted",
    tokenizer: Qwen35Tokenizer | None = None,
    scenario: Scenario | str | os.PathLike[str] | None = None,
    limits: TwinLimits | None = None,
    faults: TwinFaults | None = None,
    convention: StopConvention | None = None,
    latencies: Latencies | None = None,
    strictness: Strictness | None = None,
    reduction: Reduction = "per_token",
    accumulation: Accumulation = "sum",
    model_name: str = DEFAULT_MODEL,
    serve_tokenizer: bool = True,
    report_grad_norm: bool = True,
    port: int = 0,
    api_key: str = TWIN_API_KEY,
    max_body_bytes: int | None = None,
    idle_timeout: float | None = None,
    request_timeout: float | None = None,
    max_total_body_bytes: int | None = None,
    max_connections: int | None = None,
) -> Twin:
    """Start a twin on 127.0.0.1 (``port=0``: a free port) and return it, serving.

    ``policy`` is a name (``scripted``, ``toy``, ``learning``) or a ``TwinPolicy``; the
    tokenizer defaults to the exact Qwen3.5 one. ``serve_tokenizer=False`` answers with the
    model's real name as ``model_id``, so the SDK's tokenizer load goes to ModelScope as it
    would for a user (offline: it fails). ``report_grad_norm=False`` leaves the optimiser's
    metrics empty (the keys the live service reports are not published). ``max_body_bytes``,
    ``max_total_body_bytes``, ``idle_timeout``, ``request_timeout`` and ``max_connections``
    bound what one request and all of them together may send, how long a connection may wait
    for its next request and a request for its last byte, and how many connections are served
    (defaults in :class:`~searchr1.twin.backend.TwinSettings`).
    """
    if reduction not in ("per_token", "per_sample", "sum"):
        raise ValueError(f"reduction must be per_token, per_sample or sum, got {reduction!r}")
    if accumulation not in ("sum", "mean"):
        raise ValueError(f"accumulation must be sum or mean, got {accumulation!r}")
    if tokenizer is None:
        from searchr1.runtime.tokenizer import shared_tokenizer

        tokenizer = shared_tokenizer()
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    served = policy if not isinstance(policy, str) else make_policy(policy, tokenizer, scenario=scenario)
    model_id = str(served_tokenizer_dir(tokenizer)) if serve_tokenizer else model_name
    settings = TwinSettings(
        home=home, policy=served, tokenizer=tokenizer, base_url="", model_name=model_name,
        served_model_id=model_id, api_key=api_key, limits=limits or TwinLimits(),
        convention=convention or StopConvention(), latencies=latencies or Latencies(),
        faults=faults or TwinFaults(), strictness=strictness or Strictness(),
        reduction=reduction, accumulation=accumulation, report_grad_norm=report_grad_norm,
    )
    if max_body_bytes is not None:
        settings.max_body_bytes = max_body_bytes
    if idle_timeout is not None:
        settings.idle_timeout = idle_timeout
    if request_timeout is not None:
        settings.request_timeout = request_timeout
    if max_total_body_bytes is not None:
        settings.max_total_body_bytes = max_total_body_bytes
    if max_connections is not None:
        settings.max_connections = max_connections
    settings.max_total_body_bytes = max(settings.max_total_body_bytes, settings.max_body_bytes)
    backend = TwinBackend(settings)
    server = TwinHTTPServer(backend, port)
    settings.base_url = server.url
    server.start()
    twin = Twin(backend, server)
    LIVE_TWINS.add(twin)
    weakref.finalize(twin, _keep_untaken, server.url, backend)
    return twin

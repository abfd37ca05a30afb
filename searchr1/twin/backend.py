"""The twin's server behaviour, independent of HTTP: what each control and actor operation
does to the twin's state and what it answers.

Requests arrive here already validated with pytrio's own protocol models (the HTTP layer does
that); answers are pytrio's response models or plain dicts in their wire shape. Expected
refusals raise :class:`ApiError` (status, code, message), which the HTTP layer turns into the
JSON error body pytrio reads.

Training events run on one worker thread per training run, in submission order: a submitted
event is answered ``accepted`` at once, then becomes ``running`` and finally ``succeeded`` or
``failed``; ``get_event`` long-polls until it is final or the wait runs out. Sampling runs on
the request's own thread. Modelled latencies are real (wall-clock) waits that end early when
the twin stops.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypedDict

import numpy as np
from pytrio.protocol.actor.events.codec import payload_model_for_event
from pytrio.protocol.actor.events.event import EVENT_PROTOCOL_VERSION, EventEnvelope, EventType
from pytrio.protocol.actor.events.trainer.forward import TrainerForwardBackwardPayload
from pytrio.protocol.actor.sampling_run.sample import SampleRequest
from pytrio.protocol.control.actor.credentials import ActorConnectionInfo, ActorJWT
from pytrio.protocol.control.api_key.verify import APIKeyInfo
from pytrio.protocol.control.checkpoint.download import CheckpointDownloadResponse
from pytrio.protocol.control.checkpoint.list import CheckpointListResponse, CheckpointResponse
from pytrio.protocol.control.model.list import ModelInfo, ModelListResponse, ModelRunnerCapability
from pytrio.protocol.control.platform.bootstrap import SDKBootstrapResponse, SDKCompatibilityResponse
from pytrio.protocol.control.sampling_run.create import SamplingRunCreateRequest, SamplingRunCreateResponse
from pytrio.protocol.control.sampling_run.get import SamplingRunGetResponse
from pytrio.protocol.control.sampling_run.renew import SamplingRunRenewResponse
from pytrio.protocol.control.service_session.close import ServiceSessionCloseRequest
from pytrio.protocol.control.service_session.create import ServiceSessionCreateRequest, ServiceSessionCreateResponse
from pytrio.protocol.control.service_session.get import ServiceSessionGetResponse
from pytrio.protocol.control.service_session.renew import ServiceSessionRenewResponse
from pytrio.protocol.control.training_run.create import TrainingRunCreateRequest, TrainingRunCreateResponse
from pytrio.protocol.control.training_run.find_by_checkpoint_uri import TrainingRunFindByCheckpointURIResponse
from pytrio.protocol.control.training_run.get import TrainingRunGetResponse, TrainingRunParamsResponse
from pytrio.protocol.control.training_run.renew import TrainingRunRenewResponse
from pytrio.protocol.control.training_run.update import TrainingRunUpdateRequest, TrainingRunUpdateResponse

from searchr1.runtime.failures import STORAGE_FAILURE_CODE
from searchr1.basics.fileio import is_write_failure, write_failure_line
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.twin.collapse import collapsed_sequences, is_collapsed
from searchr1.twin.config import (
    INJECTED_FAILURE_CODE,
    Latencies,
    OperationLimits,
    StopConvention,
    Strictness,
    TwinFaults,
    TwinLimits,
)
from searchr1.twin.policy import PolicySample, Reduction, SampledSequence, TwinPolicy
from searchr1.twin.served import ServedCounter
from searchr1.twin.stops import FinishedSequence, StopRules, finish, request_values
from searchr1.twin.store import (STATE, WEIGHTS, Checkpoint, CheckpointNotFound, CheckpointStore, InvalidName,
                                 RunConfig, check_checkpoint_name)
from searchr1.twin.strict import (
    BASE_LINEAGE,
    VIOLATION_CODE,
    ProtocolViolation,
    RunProtocol,
    SampleLedger,
    Violation,
    check_sampled_actions,
    check_token_range,
)
from searchr1.twin.training_run import Accumulation, EventFailure, Source, TrainingRun

WORKSPACE = "ws-twin"
USER = "user-twin"
RUN_BROKEN_CODE = "training.run_broken"
JWT_LIFETIME = timedelta(days=1)


class ApiError(Exception):
    """A refusal: HTTP status, a stable code and a one-line message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass
class TwinSettings:
    home: Path
    policy: TwinPolicy
    tokenizer: Qwen35Tokenizer
    base_url: str
    model_name: str
    served_model_id: str
    api_key: str
    limits: TwinLimits = field(default_factory=TwinLimits)
    convention: StopConvention = field(default_factory=StopConvention)
    latencies: Latencies = field(default_factory=Latencies)
    faults: TwinFaults = field(default_factory=TwinFaults)
    strictness: Strictness = field(default_factory=Strictness)
    reduction: Reduction = "per_token"
    accumulation: Accumulation = "sum"
    report_grad_norm: bool = True  # the optimiser's metrics (the live keys are not published)
    max_body_bytes: int = 256 * 1024 * 1024  # a request body past this is answered 413 unread
    idle_timeout: float = 300.0  # seconds a kept-alive connection may wait for its next request
    request_timeout: float = 30.0  # seconds from a request's first byte to its body's last
    max_total_body_bytes: int = 256 * 1024 * 1024  # bodies held at once, all requests together
    max_connections: int = 256  # connections served at once (a thread each); beyond, closed at once


class Session(TypedDict):
    """A service session as the twin keeps it."""

    status: str
    sdk_version: str
    created: datetime
    training_runs: list[str]
    sampling_runs: list[str]


@dataclass
class EventRecord:
    envelope: EventEnvelope
    run: TrainingRun
    status: str = "accepted"
    result: dict[str, object] = field(default_factory=dict)
    error: tuple[str, str] | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "train_tokens": 0})
    done: threading.Event = field(default_factory=threading.Event)

    def response(self) -> dict[str, object]:
        body: dict[str, object] = {
            "version": EVENT_PROTOCOL_VERSION,
            "event_id": self.envelope.event_id,
            "type": self.envelope.type.value,
            "status": self.status,
        }
        if self.status == "succeeded":
            body["result"] = self.result
            body["usage"] = self.usage
        elif self.status == "failed":
            assert self.error is not None
            body["error"] = {"code": self.error[0], "message": self.error[1]}
            body["usage"] = self.usage
        return body


@dataclass
class SamplingRun:
    cuid: str
    session: str
    params: np.ndarray
    lineage: str
    version: int
    source: str
    created: datetime


@dataclass(frozen=True)
class SampleLogEntry:
    """One sampling request as the twin served it (tests and benchmarks read these)."""

    sampling_run: str
    prompt_tokens: int
    num_samples: int
    max_tokens: int
    seed: int | None
    output_tokens: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True)
class EventLogEntry:
    run: str
    type: str
    index: int
    step: int
    status: str
    code: str | None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _prompt_tokens(request: SampleRequest) -> list[int]:
    """The prompt's token ids; a prompt with anything but text is refused (400)."""
    prompt: list[int] = []
    for chunk in request.prompt.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise ApiError(400, "validation.image_unsupported", "the twin samples from text prompts only")
        prompt.extend(int(t) for t in chunk.tokens)
    return prompt


def _capability(limits: OperationLimits) -> dict[str, int | None]:
    return {"max_batch_size": limits.max_batch_size, "max_tokens_per_request": limits.max_tokens_per_request,
            "max_seq_len": limits.max_seq_len}


class TwinBackend:
    def __init__(self, settings: TwinSettings) -> None:
        self.settings = settings
        if settings.faults.sampler_noise:
            from searchr1.twin.learning_policy import LearningPolicy
            if not isinstance(settings.policy, LearningPolicy):
                raise ValueError(f"TwinFaults.sampler_noise perturbs the learning policy's candidate turns; "
                                 f"this twin serves {settings.policy.kind!r}")
        self.store = CheckpointStore(settings.home)
        self.vocab_size = len(settings.tokenizer)
        self._end_of_turn = int(settings.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.ledger = SampleLedger()
        self.violations: list[Violation] = []
        self.sample_log: list[SampleLogEntry] = []
        self.served = ServedCounter(settings.home)  # the twin's own count of what it served
        self.event_log: list[EventLogEntry] = []
        self.telemetry_batches = 0
        self._lock = threading.RLock()
        self._policy_lock = threading.Lock()
        self._stopping = threading.Event()
        self._counts: Counter[str] = Counter()
        self._sessions: dict[str, Session] = {}
        self._runs: dict[str, TrainingRun] = {}
        self._protocols: dict[str, RunProtocol] = {}
        self._sampling: dict[str, SamplingRun] = {}
        self._tokens: dict[str, str] = {}  # actor JWT -> run cuid (training or sampling)
        self._events: dict[str, EventRecord] = {}
        self._queues: dict[str, deque[EventRecord]] = {}
        self._wakeups: dict[str, threading.Condition] = {}
        self._workers: list[threading.Thread] = []
        self._jitter = np.random.default_rng(settings.latencies.jitter_seed)
        self._stop_cache: dict[tuple[tuple[object, ...], tuple[object, ...]], StopRules] = {}
        self._created = _now()

    # --- plumbing -----------------------------------------------------------------------

    @property
    def policy(self) -> TwinPolicy:
        return self.settings.policy

    def count(self, operation: str) -> int:
        """Number (from 1) of this call among the twin's calls of ``operation``."""
        with self._lock:
            self._counts[operation] += 1
            return self._counts[operation]

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; False when the twin is stopping."""
        if seconds <= 0:
            return not self._stopping.is_set()
        return not self._stopping.wait(seconds)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            conditions = list(self._wakeups.values())
        for condition in conditions:
            with condition:
                condition.notify_all()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(timeout=5)

    def record_violation(self, violation: Violation) -> None:
        with self._lock:
            self.violations.append(violation)

    def take_violations(self) -> list[Violation]:
        with self._lock:
            taken, self.violations = self.violations, []
            return taken

    def check_api_key(self, key: str | None) -> None:
        if not key or not secrets.compare_digest(key.encode(), self.settings.api_key.encode()):
            raise ApiError(401, "unauthorized", "invalid API key")

    def _jwt(self, owner: str) -> ActorJWT:
        token = f"twin-{secrets.token_hex(16)}"
        with self._lock:
            self._tokens[token] = owner
        return ActorJWT(token=token, expires_at=_now() + JWT_LIFETIME)

    def _actor(self, owner: str) -> ActorConnectionInfo:
        """One actor address for every run (pytrio then reuses one HTTP client for all of them);
        the JWT tells which run a request is for."""
        return ActorConnectionInfo(actor_cuid=f"actor-{owner}", endpoint=f"{self.settings.base_url}/actor",
                                   connect_mode="direct", tls_enabled=False)

    def actor_owner(self, authorization: str | None) -> str:
        """The run an actor request's JWT was issued for."""
        token = (authorization or "").removeprefix("Bearer ").strip()
        with self._lock:
            owner = self._tokens.get(token)
        if owner is None:
            raise ApiError(401, "unauthorized", "the actor token is not one the twin issued")
        return owner

    def _session(self, sid: str) -> Session:
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise ApiError(404, "service_session_not_found", f"service session {sid} does not exist")
        return session

    def _model(self, name: str) -> None:
        if name not in (self.settings.model_name, self.settings.served_model_id):
            raise ApiError(404, "model_not_found", f"model {name!r} is not in the twin's catalog "
                                                   f"[{self.settings.model_name!r}]")

    def _checkpoint(self, uri: str) -> Checkpoint:
        try:
            checkpoint = self.store.load(uri)
        except CheckpointNotFound as error:
            raise ApiError(404, "checkpoint_not_found", str(error)) from None
        if checkpoint.config.policy_kind != self.policy.kind:
            raise ApiError(400, "twin.policy_mismatch",
                           f"checkpoint {uri} holds {checkpoint.config.policy_kind!r} params; this twin "
                           f"serves {self.policy.kind!r} (start it with the policy the run was trained with)")
        return checkpoint

    # --- control: identity, catalog, sessions --------------------------------------------

    def verify(self) -> APIKeyInfo:
        return APIKeyInfo(api_key_tid="key-twin", api_key_name="twin", user_cuid=USER, username="twin",
                          display_name="offline twin", workspace_cuid=WORKSPACE, workspace_name="twin",
                          workspace_type="personal", expires_at=None)

    def bootstrap(self, sdk_version: str) -> SDKBootstrapResponse:
        return SDKBootstrapResponse(
            compatibility=SDKCompatibilityResponse(status="compatible", sdk_version=sdk_version),
            notices=[],
        )

    def models(self, limit: int, offset: int) -> ModelListResponse:
        limits = self.settings.limits
        name = self.settings.model_name
        info = ModelInfo(
            cuid="model-twin", alias=name, model_id=name, display_name=f"{name} (offline twin)",
            context_length=limits.max_context_length, train_available=True, sample_available=True,
            trainer=ModelRunnerCapability(**_capability(limits.training)),
            sampler=ModelRunnerCapability(**_capability(limits.sampling)),
            created_at=self._created, updated_at=self._created,
        )
        items = [info][offset: offset + limit]
        return ModelListResponse(items=items, total=1, limit=limit, offset=offset)

    def create_session(self, request: ServiceSessionCreateRequest) -> ServiceSessionCreateResponse:
        sid = f"session-{self.count('session_ids'):04d}"
        with self._lock:
            self._sessions[sid] = {"status": "ACTIVE", "sdk_version": request.sdk_version, "created": _now(),
                                   "training_runs": [], "sampling_runs": []}
        return ServiceSessionCreateResponse(service_session_cuid=sid, workspace_cuid=WORKSPACE, status="ACTIVE",
                                            created_at=self._sessions[sid]["created"])

    def renew_session(self, sid: str) -> ServiceSessionRenewResponse:
        session = self._session(sid)
        return ServiceSessionRenewResponse(service_session_cuid=sid, workspace_cuid=WORKSPACE,
                                           status=session["status"], updated_at=_now())

    def close_session(self, sid: str, request: ServiceSessionCloseRequest) -> dict[str, object]:
        session = self._session(sid)
        session["status"] = request.status
        return {"service_session_cuid": sid, "status": request.status}

    def get_session(self, sid: str) -> ServiceSessionGetResponse:
        session = self._session(sid)
        return ServiceSessionGetResponse(
            service_session_cuid=sid, workspace_cuid=WORKSPACE, status=session["status"],
            sdk_version=session["sdk_version"], training_run_cuids=list(session["training_runs"]),
            sampling_run_cuids=list(session["sampling_runs"]), created_at=session["created"], updated_at=_now(),
        )

    # --- control: training runs ----------------------------------------------------------

    def _capacity(self) -> None:
        if self.count("capacity") <= self.settings.faults.capacity_full:
            raise ApiError(429, "actor_capacity_exceeded", "the twin is at capacity (TwinFaults.capacity_full)")

    def create_training_run(self, sid: str, request: TrainingRunCreateRequest) -> TrainingRunCreateResponse:
        session = self._session(sid)
        if request.lora_rank not in range(4, 65):
            raise ApiError(400, "validation.invalid_lora_rank",
                           f"lora_rank must be in [4, 64], got {request.lora_rank}")
        base_model = request.base_model
        if request.source_checkpoint_uri:
            checkpoint = self._checkpoint(request.source_checkpoint_uri)
            if request.restore_optimizer and not checkpoint.has_optimizer:
                raise ApiError(400, "twin.no_optimizer_state",
                               f"checkpoint {checkpoint.path} holds no optimizer state (saved for sampling)")
            base_model = base_model or checkpoint.config.base_model
        self._model(base_model)
        self._capacity()
        config = RunConfig(base_model=self.settings.model_name, lora_rank=request.lora_rank, seed=request.seed,
                           train_mlp=request.train_mlp, train_attn=request.train_attn,
                           train_unembed=request.train_unembed, policy_kind=self.policy.kind)
        cuid = self.store.new_run(config)
        run = TrainingRun(cuid=cuid, session=sid, config=config, model_id=self.settings.served_model_id,
                          source=Source(request.source_checkpoint_uri, request.restore_optimizer))
        with self._lock:
            self._runs[cuid] = run
            self._protocols[cuid] = RunProtocol()
            session["training_runs"].append(cuid)
        self._start_worker(run)
        return TrainingRunCreateResponse(
            training_run_cuid=cuid, service_session_cuid=sid, workspace_cuid=WORKSPACE, status="RUNNING",
            run_index=len(session["training_runs"]), model_spec_cuid="model-twin",
            model_alias=self.settings.model_name, model_id=self.settings.served_model_id,
            trainer=_capability(self.settings.limits.training), actor=self._actor(cuid), actor_jwt=self._jwt(cuid),
            created_at=_now(),
        )

    def _run(self, cuid: str) -> TrainingRun:
        with self._lock:
            run = self._runs.get(cuid)
        if run is None:
            raise ApiError(404, "training_run_not_found", f"training run {cuid} is not live on this twin")
        return run

    def update_training_run(self, sid: str, cuid: str, request: TrainingRunUpdateRequest) -> TrainingRunUpdateResponse:
        self._session(sid)
        run = self._run(cuid)
        checkpoint = self._checkpoint(request.source_checkpoint_uri)
        if request.restore_optimizer and not checkpoint.has_optimizer:
            raise ApiError(400, "twin.no_optimizer_state",
                           f"checkpoint {checkpoint.path} holds no optimizer state (saved for sampling)")
        self._capacity()
        with run.lock:
            if run.initialized:
                raise ApiError(409, "training_run_already_initialized",
                               f"training run {cuid} has started; load_state must come first")
            run.source = Source(request.source_checkpoint_uri, request.restore_optimizer)
        return TrainingRunUpdateResponse(
            source_checkpoint_uri=request.source_checkpoint_uri, restore_optimizer=request.restore_optimizer,
            trainer=_capability(self.settings.limits.training), actor=self._actor(cuid), actor_jwt=self._jwt(cuid),
        )

    def renew_training_run(self, cuid: str) -> TrainingRunRenewResponse:
        run = self._run(cuid)
        return TrainingRunRenewResponse(training_run_cuid=cuid, service_session_cuid=run.session,
                                        workspace_cuid=WORKSPACE, actor=self._actor(cuid), actor_jwt=self._jwt(cuid))

    def find_by_checkpoint_uri(self, uri: str) -> TrainingRunFindByCheckpointURIResponse:
        checkpoint = self._checkpoint(uri)
        config = checkpoint.config
        return TrainingRunFindByCheckpointURIResponse(
            base_model=self.settings.served_model_id, lora_rank=config.lora_rank, seed=config.seed,
            train_mlp=config.train_mlp, train_attn=config.train_attn, train_unembed=config.train_unembed,
        )

    def get_training_run(self, cuid: str) -> TrainingRunGetResponse:
        try:
            config = self.store.run_config(cuid)
        except CheckpointNotFound:
            raise ApiError(404, "training_run_not_found", f"training run {cuid} does not exist") from None
        with self._lock:
            run = self._runs.get(cuid)
        source = run.source if run is not None else Source()
        params = TrainingRunParamsResponse(restore_optimizer=source.restore_optimizer, lora_rank=config.lora_rank,
                                           seed=config.seed, train_mlp=config.train_mlp, train_attn=config.train_attn,
                                           train_unembed=config.train_unembed)
        return TrainingRunGetResponse(
            training_run_cuid=cuid, base_model=config.base_model, service_session_cuid=run.session if run else "",
            workspace_cuid=WORKSPACE, status="RUNNING" if run else "ENDED", run_index=1, model_spec_cuid="model-twin",
            is_lora=True, source_checkpoint_uri=source.checkpoint_uri or None,
            restore_optimizer=source.restore_optimizer, lora_rank=config.lora_rank, seed=config.seed,
            train_mlp=config.train_mlp, train_attn=config.train_attn, train_unembed=config.train_unembed,
            corrupted=bool(run and run.broken), corrupted_reason=run.broken if run else None,
            training_params=params, created_at=self._created, updated_at=_now(),
        )

    def list_checkpoints(self, run: str | None, limit: int, offset: int) -> CheckpointListResponse:
        """Every checkpoint on disk (of one run, or of every run under the home), sorted."""
        runs = [run] if run else sorted(p.name for p in (self.store.home / "runs").iterdir() if p.is_dir())
        found = []
        for cuid in runs:
            try:
                config = self.store.run_config(cuid)
            except CheckpointNotFound:
                raise ApiError(404, "training_run_not_found", f"training run {cuid} does not exist") from None
            for kind, name in self.store.names(cuid):
                path = self.store.home / "runs" / cuid / kind / f"{name}.npz"
                stat = path.stat()
                when = datetime.fromtimestamp(stat.st_mtime, timezone.utc)
                uri = f"trio://twin/{cuid}/{kind}/{name}"
                found.append(CheckpointResponse(
                    cuid=f"{cuid}/{kind}/{name}", checkpoint_cuid=f"{cuid}/{kind}/{name}", training_run_cuid=cuid,
                    workspace_cuid=WORKSPACE, name=name, checkpoint_type="TRAINING" if kind == STATE else "SAMPLER",
                    status="READY", checkpoint_uri=uri, model=config.base_model, base_model=config.base_model,
                    model_spec_cuid="model-twin", task_id=cuid, task_created_at=self._created, task_status="RUNNING",
                    path=uri, created_at=when, size_bytes=stat.st_size, lora_rank=config.lora_rank, is_uploaded=False,
                ))
        return CheckpointListResponse(checkpoints=found[offset: offset + limit],
                                      cursor={"offset": offset, "limit": limit, "total": len(found)})

    # --- control: checkpoint downloads ---------------------------------------------------

    def archive_signature(self, cuid: str) -> str:
        """The signature of a download URL (the object store's signed URL, in miniature)."""
        import hashlib

        return hashlib.sha256(f"{self.settings.api_key}\0{cuid}".encode()).hexdigest()[:32]

    def _sampler_checkpoint(self, cuid: str) -> Checkpoint:
        kind = cuid.split("/")[1] if cuid.count("/") == 2 else ""
        if kind == STATE:
            raise ApiError(400, "checkpoint_not_downloadable",
                           f"checkpoint {cuid} is training state; only sampler weights are downloadable")
        try:
            return self.store.load(f"trio://twin/{cuid}")
        except CheckpointNotFound as error:
            raise ApiError(404, "checkpoint_not_found", str(error)) from None

    def checkpoint_download_url(self, cuid: str) -> CheckpointDownloadResponse:
        """Where a sampler checkpoint's archive (:mod:`searchr1.twin.archive`) is served."""
        self._sampler_checkpoint(cuid)
        url = f"{self.settings.base_url}/archives/{cuid}?sig={self.archive_signature(cuid)}"
        return CheckpointDownloadResponse(url=url, expires_at=_now() + timedelta(hours=1), source="object_storage",
                                          checkpoint_status="READY", tls_cert_pem=None, tls_not_after=None)

    def checkpoint_archive(self, cuid: str, signature: str) -> bytes:
        import hmac

        from searchr1.twin.archive import checkpoint_archive

        if not hmac.compare_digest(signature, self.archive_signature(cuid)):
            raise ApiError(403, "signature_mismatch", "the download URL's signature does not match")
        return checkpoint_archive(self._sampler_checkpoint(cuid))

    # --- control: sampling runs ----------------------------------------------------------

    def create_sampling_run(self, sid: str, request: SamplingRunCreateRequest) -> SamplingRunCreateResponse:
        session = self._session(sid)
        self._model(request.base_model)
        if request.source_checkpoint_uri:
            checkpoint = self._checkpoint(request.source_checkpoint_uri)
            params, lineage, version = checkpoint.params, checkpoint.lineage, checkpoint.version
        else:
            params, lineage, version = self.policy.initial_params(), BASE_LINEAGE, 0
        cuid = f"sampler-{self.count('sampling_ids'):04d}"
        sampling = SamplingRun(cuid, sid, params, lineage, version, request.source_checkpoint_uri, _now())
        with self._lock:
            self._sampling[cuid] = sampling
            session["sampling_runs"].append(cuid)
        return SamplingRunCreateResponse(
            sampling_run_cuid=cuid, service_session_cuid=sid, workspace_cuid=WORKSPACE, status="RUNNING",
            run_index=len(session["sampling_runs"]), model_spec_cuid="model-twin",
            model_alias=self.settings.model_name, model_id=self.settings.served_model_id,
            sampler=_capability(self.settings.limits.sampling), actor=self._actor(cuid), actor_jwt=self._jwt(cuid),
            created_at=sampling.created,
        )

    def _sampling_run(self, cuid: str) -> SamplingRun:
        with self._lock:
            sampling = self._sampling.get(cuid)
        if sampling is None:
            raise ApiError(404, "sampling_run_not_found", f"sampling run {cuid} does not exist")
        return sampling

    def renew_sampling_run(self, cuid: str) -> SamplingRunRenewResponse:
        sampling = self._sampling_run(cuid)
        return SamplingRunRenewResponse(sampling_run_cuid=cuid, service_session_cuid=sampling.session,
                                        workspace_cuid=WORKSPACE, actor=self._actor(cuid), actor_jwt=self._jwt(cuid))

    def get_sampling_run(self, cuid: str) -> SamplingRunGetResponse:
        sampling = self._sampling_run(cuid)
        return SamplingRunGetResponse(
            sampling_run_cuid=cuid, service_session_cuid=sampling.session, workspace_cuid=WORKSPACE,
            status="RUNNING", base_model=self.settings.model_name, model_id=self.settings.served_model_id,
            alias=self.settings.model_name, source_checkpoint_uri=sampling.source or None,
            created_at=sampling.created, updated_at=_now(),
        )

    # --- actor: training events ----------------------------------------------------------

    def _start_worker(self, run: TrainingRun) -> None:
        condition = threading.Condition()
        with self._lock:
            self._queues[run.cuid] = deque()
            self._wakeups[run.cuid] = condition
        worker = threading.Thread(target=self._work, args=(run.cuid,), name=f"twin-{run.cuid}", daemon=True)
        self._workers.append(worker)
        worker.start()

    def submit_event(self, owner: str, envelope: EventEnvelope) -> dict[str, object]:
        run = self._run(owner)
        if envelope.metadata.run_id != run.cuid:
            raise ApiError(400, "event_run_mismatch", f"event for run {envelope.metadata.run_id} sent to {run.cuid}")
        try:
            payload = payload_model_for_event(envelope.type).model_validate(envelope.payload)
        except Exception as error:  # noqa: BLE001 - a pydantic or schema error is a bad request
            raise ApiError(422, "validation_error",
                           f"{envelope.type.value} payload: {str(error).splitlines()[0]}") from None
        if envelope.type in (EventType.TRAINER_SAVE_STATE, EventType.TRAINER_SAVE_WEIGHTS):
            check_checkpoint_name(payload.name)  # InvalidName: answered 400 before anything runs
        record = EventRecord(envelope, run)
        with self._lock:
            if envelope.event_id in self._events:
                raise ApiError(409, "event_exists", f"event {envelope.event_id} was already submitted")
            self._events[envelope.event_id] = record
            condition = self._wakeups[run.cuid]
        with condition:
            self._queues[run.cuid].append(record)
            condition.notify_all()
        return record.response()

    def get_event(self, owner: str, event_id: str, wait_seconds: float) -> dict[str, object]:
        with self._lock:
            record = self._events.get(event_id)
        if record is None or record.run.cuid != owner:
            raise ApiError(404, "event_not_found", f"event {event_id} is unknown to {owner}")
        record.done.wait(max(0.0, wait_seconds))
        return record.response()

    def _work(self, cuid: str) -> None:
        condition = self._wakeups[cuid]
        queue = self._queues[cuid]
        while True:
            with condition:
                while not queue and not self._stopping.is_set():
                    condition.wait()
                if self._stopping.is_set():
                    return
                record = queue.popleft()
            record.status = "running"
            if not self.wait(self.settings.faults.slow_events):
                return
            self._execute(record)
            if record.status == "succeeded":
                self.served.event(record.envelope.type.value.removeprefix("trainer."),
                                  train_tokens=record.usage["train_tokens"])
            record.envelope.payload.clear()  # the datums are not needed once the event ran
            with self._lock:
                meta = record.envelope.metadata
                self.event_log.append(EventLogEntry(cuid, record.envelope.type.value, meta.index, meta.step,
                                                    record.status, record.error[0] if record.error else None))
            record.done.set()

    def _execute(self, record: EventRecord) -> None:
        run, envelope = record.run, record.envelope
        name = envelope.type.value.removeprefix("trainer.")
        try:
            with run.lock:
                record.result = self._apply(run, envelope, name, record)
            record.status = "succeeded"
        except ProtocolViolation as violation:
            self.record_violation(Violation(violation.rule, violation.detail, run.cuid, envelope.event_id))
            record.status, record.error = "failed", (VIOLATION_CODE, str(violation))
        except EventFailure as failure:
            record.status, record.error = "failed", (failure.code, failure.message)
        except CheckpointNotFound as error:
            record.status, record.error = "failed", ("checkpoint_not_found", str(error))
        except InvalidName as error:
            record.status, record.error = "failed", ("invalid_name", str(error))
        except OSError as error:
            if is_write_failure(error):  # the twin's own disk: the path and the cause
                record.status, record.error = "failed", (STORAGE_FAILURE_CODE, f"the twin {write_failure_line(error)}")
            else:
                record.status, record.error = "failed", ("twin.internal_error", f"{type(error).__name__}: {error}")
        except Exception as error:  # noqa: BLE001 - a policy or twin bug fails the event, not the worker
            record.status, record.error = "failed", ("twin.internal_error", f"{type(error).__name__}: {error}")

    def _apply(self, run: TrainingRun, envelope: EventEnvelope, name: str, record: EventRecord) -> dict[str, object]:
        settings = self.settings
        strict = settings.strictness
        checks = strict.enabled
        meta = envelope.metadata
        payload = payload_model_for_event(envelope.type).model_validate(envelope.payload)
        forward = envelope.type in (EventType.TRAINER_FORWARD, EventType.TRAINER_FORWARD_BACKWARD)
        samples = [PolicySample.from_wire(d, auto_shift=payload.auto_shift) for d in payload.data] if forward else []
        if checks:  # the event arrived: it counts in the run's order and its call's totals, whatever happens next
            protocol = self._protocols[run.cuid]
            protocol.admit(envelope.type.value, meta.index, meta.step)
            if forward:
                spec = payload.gradient_accumulation
                protocol.receive_chunk(envelope.type.value, meta.step, (spec.total_samples, spec.total_active_tokens,
                                       spec.total_advantage_tokens), samples, payload.loss.type.strip().lower())
        if run.broken is not None:
            raise EventFailure(RUN_BROKEN_CODE, run.broken)
        number = self.count(f"event:{name}")
        if number in settings.faults.broken_runs.get(name, ()):
            run.broken = (f"training run {run.cuid} is broken: {name} call {number} failed "
                          "(TwinFaults.broken_runs)")
            raise EventFailure(INJECTED_FAILURE_CODE, f"injected failure of {name} call {number}; the run is broken")
        code = settings.faults.failed_events.get(name, {}).get(number)
        if code is not None:
            raise EventFailure(code, f"injected failure of {name} call {number} (TwinFaults.failed_events)")
        if envelope.type == EventType.TRAINER_INIT_RUN:
            return run.init(self.policy, self.store)
        if not run.initialized:
            raise EventFailure("twin.not_initialized", f"training run {run.cuid} received {name} before init_run")
        if forward:
            return self._forward(run, payload, samples, record,
                                 backward=envelope.type == EventType.TRAINER_FORWARD_BACKWARD, checks=checks)
        if envelope.type == EventType.TRAINER_OPTIMIZE_STEP:
            self.wait(settings.latencies.optim_step)
            before = run.version
            result = run.optimize(payload, settings.accumulation)
            if not settings.report_grad_norm:
                result = {"metrics": {}}
            if run.version != before and strict.enabled:
                # one generation past the allowed staleness is kept, so a stale sampler is named as such
                self.ledger.forget_older_than(run.lineage, run.version - strict.max_staleness - 1)
            return result
        if envelope.type in (EventType.TRAINER_SAVE_STATE, EventType.TRAINER_SAVE_WEIGHTS):
            self.wait(settings.latencies.weight_save)
            kind = STATE if envelope.type == EventType.TRAINER_SAVE_STATE else WEIGHTS
            return run.save(payload, kind, self.store, settings.model_name)
        raise EventFailure("twin.unsupported_event", f"the twin does not run {envelope.type.value} events")

    def _forward(self, run: TrainingRun, payload: TrainerForwardBackwardPayload, samples: list[PolicySample],
                 record: EventRecord, *, backward: bool, checks: bool) -> dict[str, object]:
        settings = self.settings
        limits = settings.limits.training
        tokens = sum(len(s.inputs) + int(payload.auto_shift) for s in samples)
        if limits.max_batch_size is not None and len(samples) > limits.max_batch_size:
            raise EventFailure("twin.training_batch_too_large",
                               f"{len(samples)} datums in one chunk; max_batch_size is {limits.max_batch_size}")
        if limits.max_tokens_per_request is not None and tokens > limits.max_tokens_per_request:
            raise EventFailure("twin.training_request_too_large",
                               f"{tokens} tokens in one chunk; max_tokens_per_request is "
                               f"{limits.max_tokens_per_request}")
        longest = max(len(s.inputs) + int(payload.auto_shift) for s in samples)
        if limits.max_seq_len is not None and longest > limits.max_seq_len:
            raise EventFailure("twin.training_sample_too_long",
                               f"a datum of {longest} tokens; max_seq_len is {limits.max_seq_len}")
        loss_fn = payload.loss.type.strip().lower()
        if checks:
            check_token_range(samples, self.vocab_size)
            if backward and settings.strictness.sampled_actions and loss_fn != "cross_entropy":
                check_sampled_actions(samples, self.ledger, lineage=run.lineage, version=run.version,
                                      max_staleness=settings.strictness.max_staleness)
        self.wait(settings.latencies.trained_token * tokens)
        with self._policy_lock:
            result = run.forward(payload, samples, step=record.envelope.metadata.step, backward=backward,
                                 policy=self.policy, reduction=settings.reduction,
                                 strict_config=settings.strictness.enabled)
            if checks and not backward:  # a proximal policy's logprobs may come back (--correction decoupled)
                self.ledger.record_learned(samples, run.last_logprobs, lineage=run.lineage, version=run.version)
        record.usage = {"input_tokens": tokens, "output_tokens": 0, "train_tokens": tokens if backward else 0}
        return result

    # --- actor: sampling ------------------------------------------------------------------

    def sample(self, owner: str, request: SampleRequest) -> tuple[dict[str, object], float]:
        """The response body and when (on ``time.monotonic()``) the modelled service time is up:
        it counts from the start of this call, so the twin's own work is part of it, as a real
        server's is, instead of coming on top."""
        sampling = self._sampling_run(owner)
        started = time.monotonic()
        prompt = _prompt_tokens(request)
        params = request.sampling_params
        max_tokens = int(params["max_tokens"])
        self._check_sample_request(request, prompt, max_tokens)
        seed = params.get("seed")
        temperature = float(params.get("temperature", 1.0))
        drawn = self._draw(sampling, request, prompt, max_tokens, seed=seed, temperature=temperature)
        sequences = self._finished(drawn, params, return_text=request.return_text)
        if self.settings.strictness.enabled:
            self.ledger.record(prompt, [(s.tokens, s.logprobs) for s in sequences], lineage=sampling.lineage,
                               version=sampling.version)
        output = sum(len(s.tokens) for s in sequences)
        delay = self._sampling_delay(sequences)
        body: dict[str, object] = {
            "request_id": request.request_id,
            "sampling_run": owner,
            "sequences": [
                {"tokens": s.tokens, "text": s.text,
                 "logprobs": s.logprobs if request.return_token_logprobs else [], "stop_reason": s.stop_reason}
                for s in sequences
            ],
            "usage": {"input_tokens": len(prompt), "output_tokens": output},
        }
        if request.return_prompt_logprobs:
            body["prompt_logprobs"] = self._prompt_logprobs(sampling, prompt)
        self.served.sampled(len(prompt), output, prompt_logprobs=bool(request.return_prompt_logprobs))
        with self._lock:
            self.sample_log.append(SampleLogEntry(owner, len(prompt), request.num_samples, max_tokens,
                                                  None if seed is None else int(seed),
                                                  tuple(len(s.tokens) for s in sequences), started,
                                                  started + delay))
        return body, started + delay

    def _check_sample_request(self, request: SampleRequest, prompt: list[int], max_tokens: int) -> None:
        """Refuse (400) a prompt token outside the vocabulary and a request over the sampling limits."""
        limits = self.settings.limits.sampling
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            raise ApiError(400, "validation.token_id_out_of_range",
                           f"a prompt token id is outside [0, {self.vocab_size})")
        if limits.max_batch_size is not None and request.num_samples > limits.max_batch_size:
            raise ApiError(400, "sampling.batch_too_large",
                           f"num_samples {request.num_samples} exceeds max_batch_size {limits.max_batch_size}")
        if limits.max_seq_len is not None and len(prompt) + max_tokens > limits.max_seq_len:
            raise ApiError(400, "sampling.sequence_too_long",
                           f"prompt of {len(prompt)} tokens + max_tokens {max_tokens} exceeds max_seq_len "
                           f"{limits.max_seq_len}")
        request_tokens = request.num_samples * (len(prompt) + max_tokens)
        if limits.max_tokens_per_request is not None and request_tokens > limits.max_tokens_per_request:
            raise ApiError(400, "sampling.request_too_large",
                           f"num_samples x (prompt + max_tokens) = {request_tokens} exceeds max_tokens_per_request "
                           f"{limits.max_tokens_per_request}")

    def _draw(self, sampling: SamplingRun, request: SampleRequest, prompt: list[int], max_tokens: int, *,
              seed: str | int | float | None, temperature: float) -> list[SampledSequence]:
        """The sequences drawn for ``prompt``: a collapsed policy's, the judge's rule answers to
        the eval judge prompt, else the policy's (with the request's ``seed``). A prompt the
        policy cannot answer, or a seed that is not a number, is refused (422), unless the
        request wants its prompt logprobs: then every sequence ends the turn at once."""
        try:
            if is_collapsed(self.settings.faults.collapse_from, sampling.version):
                return collapsed_sequences(self.settings.tokenizer, request.num_samples, max_tokens=max_tokens)
            from searchr1.twin.judge import judge_reply  # the eval judge prompt: the twin's rule answers

            judged = judge_reply(self.settings.tokenizer, prompt, request.num_samples, self._end_of_turn)
            if judged is not None:
                return judged
            noise = self.settings.faults.sampler_noise
            with self._policy_lock:
                if noise:  # the sampler-learner mismatch (searchr1.twin.mismatch); the learning policy's alone
                    from searchr1.twin.learning_policy import LearningPolicy
                    assert isinstance(self.policy, LearningPolicy)  # TwinBackend refuses any other
                    return self.policy.sample(sampling.params, prompt, request.num_samples, max_tokens=max_tokens,
                                              seed=None if seed is None else int(seed), temperature=temperature,
                                              logit_noise=noise)
                return self.policy.sample(sampling.params, prompt, request.num_samples, max_tokens=max_tokens,
                                          seed=None if seed is None else int(seed),
                                          temperature=temperature)
        except ValueError as error:  # the policy cannot answer this prompt (e.g. not in the script)
            if not request.return_prompt_logprobs:
                raise ApiError(422, "twin.policy_refused", str(error)) from None
            # A prompt-logprob request (a KL penalty's base logprobs: a whole trajectory as the
            # prompt) wants the prompt's logprobs, which every policy can give; where the policy
            # has no continuation for the prompt, the twin ends the turn at once.
            return [SampledSequence([self._end_of_turn], [0.0], True)] * request.num_samples

    def _finished(self, drawn: list[SampledSequence], params: Mapping[str, object], *,
                  return_text: bool) -> list[FinishedSequence]:
        """The drawn sequences as a server returns them: float32 logprobs, cut at the request's
        stop rules under the twin's convention, with their text when asked for."""
        tokenizer = self.settings.tokenizer
        rules = self._stop_rules(params)

        def decode(ids: list[int], skip_special: bool) -> str:
            return tokenizer.decode(ids, skip_special_tokens=skip_special)

        sequences = []
        for sequence in drawn:
            rounded = [float(np.float32(x)) for x in sequence.logprobs]  # a server returns float32 logprobs
            done = finish(type(sequence)(list(sequence.tokens), rounded, sequence.stopped), rules,
                          self.settings.convention, decode=decode, return_text=return_text)
            sequences.append(done)
        return sequences

    def _sampling_delay(self, sequences: list[FinishedSequence]) -> float:
        """The modelled service time of a request: the sequences of one request are generated side
        by side, so the longest sets it, plus the jitter when one is set."""
        latency = self.settings.latencies
        delay = latency.sample_request + latency.sampled_token * max((len(s.tokens) for s in sequences), default=0)
        if latency.sample_jitter:
            with self._lock:
                delay += float(self._jitter.uniform(0.0, latency.sample_jitter))
        return delay

    def _stop_rules(self, params: Mapping[str, object]) -> StopRules:
        key = (tuple(request_values(params, "stop")), tuple(request_values(params, "stop_token_ids")))
        with self._lock:
            rules = self._stop_cache.get(key)
        if rules is None:
            rules = StopRules.from_request(params, self.settings.tokenizer)
            with self._lock:
                self._stop_cache[key] = rules
        return rules

    def _prompt_logprobs(self, sampling: SamplingRun, prompt: list[int]) -> list[float | None]:
        """Through the policy's own loss: the target logprobs of a cross-entropy datum."""
        if len(prompt) < 2:
            return [None] * len(prompt)
        sample = PolicySample.from_arrays(prompt[:-1], prompt[1:])
        from searchr1.twin.policy import totals_of

        with self._policy_lock:
            result = self.policy.loss_and_grad(sampling.params, [sample], loss_fn="cross_entropy",
                                               reduction="sum", totals=totals_of([sample]))
        return [None, *(float(np.float32(v)) for v in result.logprobs[0])]

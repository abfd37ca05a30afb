"""The fake ``TrainingClient``: pytrio's validation, an honest toy-policy gradient.

Every ``forward``/``forward_backward`` runs pytrio 0.2.9's own batch planner
(``plan_training_batch``), so the same inputs are rejected with the same errors, and the
call is split into the same chunks under the configured limits. Each chunk's loss and
gradient are computed exactly on the toy policy (:mod:`searchr1.toy_policy`), normalised by
the totals of the *whole call* as pytrio sends them, and added up. Metrics are aggregated
over chunks exactly as pytrio does (``loss_sum`` and ``token_count`` summed, ``loss_mean`` =
their ratio).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pytrio.client.builders.training import build_trainer_save_payload
from pytrio.client.training_batch import plan_training_batch
from pytrio.errors.base import PyTrioError, ValidationError
from pytrio.errors.event import EventFailedError
from pytrio.protocol.actor.events.trainer.lora import (
    CheckpointLoraSource,
    FreshLoraSource,
    LoraRunSpec,
)
from pytrio.types import (
    AdamParams,
    APIFuture,
    Datum,
    ForwardBackwardOutput,
    OptimStepResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
    TensorData,
)

from ..toy_policy import AdamState, PolicySample, Totals, adam_step, loss_and_grad
from .faults import INJECTED_FAILURE_CODE
from .futures import completed, failed
from .sampling import FakeSamplingClient
from .store import STATE, WEIGHTS, RunConfig

if TYPE_CHECKING:
    from .service import FakeServiceClient

TEMP_SAMPLING_PREFIX = "temp-sampling-"
UNSUPPORTED_LOSS_CODE = "fake.unsupported_loss"
CHECKPOINT_EXISTS_CODE = "fake.checkpoint_exists"

F = TypeVar("F", bound=Callable[..., Any])


def _serialized(method: F) -> F:
    """Run under the client's lock: pytrio orders a client's events, so threads see them in
    one order here too."""

    @functools.wraps(method)
    def wrapper(self: FakeTrainingClient, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class FakeTrainingClient:
    """Satisfies ``TrainerLike``. Created by :class:`FakeServiceClient`, never directly."""

    def __init__(
        self,
        service: FakeServiceClient,
        *,
        run_id: str,
        config: RunConfig,
        params: np.ndarray,
        adam: AdamState,
        source_path: str | None = None,
    ) -> None:
        self._service = service
        self._run_id = run_id
        self._config = config
        self.training_run_cuid = run_id
        self.model_id = config.base_model
        self.model_alias = config.base_model
        self.lora = LoraRunSpec(
            model_id=config.base_model,
            rank=config.lora_rank,
            seed=config.seed,
            train_mlp=config.train_mlp,
            train_attn=config.train_attn,
            train_unembed=config.train_unembed,
            source=CheckpointLoraSource(source_path) if source_path else FreshLoraSource(),
        )
        self._params = params  # the LoRA delta on top of the base table
        self._adam = adam
        self._pending_grads: list[np.ndarray] = []
        self._initialized = False  # set by the first training operation
        self._broken: str | None = None
        self._temp_samplers = 0
        self._lock = threading.RLock()

    # --- state visible to tests ----------------------------------------------------------

    @property
    def weights(self) -> np.ndarray:
        """The effective toy-policy table (base + LoRA delta)."""
        return self._service.base_weights(self._config.base_model) + self._params

    @property
    def adam_state(self) -> AdamState:
        return self._adam

    @property
    def accumulated_gradient(self) -> np.ndarray:
        """What the next ``optim_step`` would apply (test introspection, not pytrio API)."""
        if not self._pending_grads:
            return np.zeros_like(self._params)
        grad = np.sum(self._pending_grads, axis=0)
        return grad / len(self._pending_grads) if self._service.accumulation == "mean" else grad

    @property
    def broken(self) -> bool:
        return self._broken is not None

    # --- helpers ------------------------------------------------------------------------

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise PyTrioError(self._broken, code="training.run_broken")

    def _begin_operation(self) -> None:
        self._raise_if_broken()
        self._initialized = True

    def _event_failure(self, what: str, number: int) -> EventFailedError:
        return EventFailedError(
            f"fake-{self._run_id}-{what}-{number}",
            INJECTED_FAILURE_CODE,
            f"injected failure of {what} call {number} (FakeFaults)",
            task_cuid=self._run_id,
        )

    # --- forward / forward_backward -----------------------------------------------------

    def _run_forward(
        self,
        data: list[Datum],
        loss_fn: str,
        auto_shift: bool,
        *,
        backward: bool,
    ) -> APIFuture[ForwardBackwardOutput]:
        if not data:
            raise ValidationError(
                "training data cannot be empty", code="validation.empty_training_data"
            )
        plan = plan_training_batch(
            data,
            loss_fn=loss_fn,
            auto_shift=auto_shift,
            limits=self._service.limits,
            tokenizer_vocab_size=self._service.vocab_size,
        )
        self._begin_operation()
        if backward:
            number = self._service._count("forward_backward")
            faults = self._service.faults
            if number in faults.break_run_on_forward_backward_calls:
                self._broken = (
                    f"training run {self._run_id} is broken: forward_backward call {number} "
                    "failed (FakeFaults.break_run_on_forward_backward_calls)"
                )
                return failed(self._event_failure("forward_backward", number))
            if number in faults.fail_forward_backward_calls:
                return failed(self._event_failure("forward_backward", number))
        normalized = loss_fn.strip().lower()
        if normalized not in ("importance_sampling", "cross_entropy"):
            return failed(
                EventFailedError(
                    f"fake-{self._run_id}-loss",
                    UNSUPPORTED_LOSS_CODE,
                    f"the fake computes importance_sampling and cross_entropy only, not {normalized}",
                )
            )
        totals = Totals(
            samples=plan.totals.total_samples,
            active_tokens=plan.totals.total_active_tokens,
            advantage_tokens=plan.totals.total_advantage_tokens,
        )
        weights = self.weights
        grad = np.zeros_like(self._params)
        loss_sum = 0.0
        token_count = 0
        outputs: list[dict[str, TensorData]] = []
        start = 0
        for chunk in plan.chunks:  # same chunks (and order) as pytrio would send
            chunk_data = data[start : start + len(chunk.samples)]
            start += len(chunk.samples)
            samples = [PolicySample.from_datum(d, auto_shift=auto_shift) for d in chunk_data]
            result = loss_and_grad(
                weights,
                samples,
                vocab_size=self._service.vocab_size,
                loss_fn=normalized,
                reduction=self._service.reduction,
                totals=totals,
            )
            grad += result.grad
            loss_sum += result.loss_sum
            token_count += result.token_count
            for logprobs in result.logprobs:
                if auto_shift:  # report one value per input position, 0.0 for the first
                    logprobs = np.concatenate([[0.0], logprobs])
                outputs.append({"logprobs": TensorData.from_numpy(logprobs.astype(np.float32))})
        if backward:
            self._pending_grads.append(grad)
        return completed(
            ForwardBackwardOutput(
                loss_fn_outputs=outputs,
                metrics={
                    "loss_sum": loss_sum,
                    "loss_mean": loss_sum / token_count if token_count > 0 else 0.0,
                    "token_count": float(token_count),
                },
            )
        )

    @_serialized
    def forward(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> APIFuture[ForwardBackwardOutput]:
        return self._run_forward(data, loss_fn, auto_shift, backward=False)

    async def forward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> APIFuture[ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config, auto_shift)

    @_serialized
    def forward_backward(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> APIFuture[ForwardBackwardOutput]:
        return self._run_forward(data, loss_fn, auto_shift, backward=True)

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> APIFuture[ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config, auto_shift)

    # --- optimiser ----------------------------------------------------------------------

    @_serialized
    def optim_step(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        """Apply the gradients accumulated since the last step (summed, or averaged with
        ``accumulation="mean"``). Invented: without any accumulated gradient nothing changes;
        ``metrics`` holds only ``grad_norm`` (the pre-clipping norm of the applied gradient)."""
        self._begin_operation()
        number = self._service._count("optim_step")
        if number in self._service.faults.fail_optim_step_calls:
            return failed(self._event_failure("optim_step", number))
        if not self._pending_grads:
            return completed(OptimStepResponse(metrics={"grad_norm": 0.0}))
        grad = self.accumulated_gradient
        self._pending_grads = []
        update = adam_step(self._params, grad, self._adam, adam_params)
        self._params, self._adam = update.params, update.state
        return completed(OptimStepResponse(metrics={"grad_norm": update.grad_norm}))

    async def optim_step_async(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self.optim_step(adam_params)

    # --- checkpoints --------------------------------------------------------------------

    def _save(
        self, kind: str, name: str, ttl_seconds: int | None, overwrite: bool
    ) -> tuple[str, int] | EventFailedError:
        normalized = build_trainer_save_payload(name, ttl_seconds, overwrite=overwrite).name
        self._begin_operation()
        store = self._service.store
        if store.exists(self._run_id, kind, normalized) and not overwrite:
            return EventFailedError(
                f"fake-{self._run_id}-save",
                CHECKPOINT_EXISTS_CODE,
                f"checkpoint {normalized!r} already exists in run {self._run_id}; "
                "pass overwrite=True to replace it (fake rule)",
            )
        adam = (self._adam.m, self._adam.v, self._adam.step) if kind == STATE else None
        return store.save(self._run_id, kind, normalized, self._config, self._params, adam)

    @_serialized
    def save_state(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> APIFuture[SaveWeightsResponse]:
        saved = self._save(STATE, name, ttl_seconds, overwrite)
        if isinstance(saved, EventFailedError):
            return failed(saved)
        path, size = saved
        return completed(SaveWeightsResponse(path=path, model=self.model_id, size=size))

    async def save_state_async(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> APIFuture[SaveWeightsResponse]:
        return self.save_state(name, ttl_seconds, overwrite)

    @_serialized
    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None
    ) -> APIFuture[SaveWeightsForSamplerResponse]:
        saved = self._save(WEIGHTS, name, ttl_seconds, overwrite=False)
        if isinstance(saved, EventFailedError):
            return failed(saved)
        path, size = saved
        return completed(SaveWeightsForSamplerResponse(path=path, model=self.model_id, size=size))

    async def save_weights_for_sampler_async(
        self, name: str, ttl_seconds: int | None = None
    ) -> APIFuture[SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds)

    @_serialized
    def save_weights_and_get_sampling_client(self) -> FakeSamplingClient:
        """Saves ``temp-sampling-<32 hex>`` weights and builds a sampler on them. pytrio
        uses a random uuid4; here the hex is derived from the run and a counter so that
        paths are reproducible."""
        self._temp_samplers += 1
        digest = hashlib.sha256(f"{self._run_id}:{self._temp_samplers}".encode()).hexdigest()[:32]
        response = self.save_weights_for_sampler(
            f"{TEMP_SAMPLING_PREFIX}{digest}", 6 * 3600
        ).result()
        return self._service._make_sampling_client(self.model_id, response.path)

    async def save_weights_and_get_sampling_client_async(self) -> FakeSamplingClient:
        return self.save_weights_and_get_sampling_client()

    def create_sampling_client(self, model_path: str) -> FakeSamplingClient:
        return self._service._make_sampling_client(self.model_alias, model_path)

    async def create_sampling_client_async(self, model_path: str) -> FakeSamplingClient:
        return self.create_sampling_client(model_path)

    def _load(self, path: str, *, with_optimizer: bool) -> APIFuture[dict[str, object]]:
        if self._initialized:
            raise ValidationError(
                "load_state cannot be called after training has started. "
                "Call load_state before the first training operation.",
                code="validation.already_initialized",
            )
        checkpoint = self._service.store.load(path)
        source = checkpoint.config
        mismatches: list[dict[str, object]] = [
            {"field": field, "target": target, "source": value}
            for field, target, value in (
                ("base_model", self.model_id, source.base_model),
                ("lora_rank", self._config.lora_rank, source.lora_rank),
                ("train_mlp", self._config.train_mlp, source.train_mlp),
                ("train_attn", self._config.train_attn, source.train_attn),
                ("train_unembed", self._config.train_unembed, source.train_unembed),
            )
            if target != value
        ]
        if mismatches:
            summary = ", ".join(
                f"{m['field']} (target={m['target']!r}, source={m['source']!r})" for m in mismatches
            )
            raise ValidationError(
                f"Checkpoint configuration is incompatible: {summary}.",
                code="validation.checkpoint_config_mismatch",
                details={"mismatches": mismatches},
            )
        self._params = checkpoint.params
        if with_optimizer:
            self._adam = self._service._adam_from(checkpoint)
        self._initialized = True
        return completed({})

    @_serialized
    def load_state(self, path: str) -> APIFuture[dict[str, object]]:
        return self._load(path, with_optimizer=False)

    async def load_state_async(self, path: str) -> APIFuture[dict[str, object]]:
        return self.load_state(path)

    @_serialized
    def load_state_with_optimizer(self, path: str) -> APIFuture[dict[str, object]]:
        return self._load(path, with_optimizer=True)

    async def load_state_with_optimizer_async(self, path: str) -> APIFuture[dict[str, object]]:
        return self.load_state_with_optimizer(path)

    def get_tokenizer(self) -> Any:
        return self._service.tokenizer

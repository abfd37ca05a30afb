"""One training run on the twin: its parameters, optimiser state and accumulated gradients,
and what each trainer event does to them.

``forward`` / ``forward_backward`` compute the loss the payload names
(:mod:`searchr1.core.objective`; a ``loss_fn_config`` key that loss does not take fails the event
under strict mode, ``twin.unsupported_loss_config``, and is ignored otherwise) and reduce every
chunk with the totals of its whole call (as pytrio sends them), so a call split into chunks accumulates exactly the
gradient of the
unsplit call. Chunks of one call share pytrio's ``step``; at ``optimize_step`` the calls
accumulated since the last step combine by ``sum`` (default) or ``mean``. The twin invents
(the service does not publish): the reduction switch, the combination switch, the metrics
(``loss_sum`` unreduced, ``token_count`` the active targets, optimiser ``grad_norm`` before
clipping), that an ``optimize_step`` without gradients changes nothing, and that saving
under an existing name without ``overwrite`` fails (``twin.checkpoint_exists``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pytrio.protocol.actor.events.tensor import WireTensorData
from pytrio.protocol.actor.events.trainer.forward import TrainerForwardBackwardPayload
from pytrio.protocol.actor.events.trainer.optimize_step import TrainerOptimizeStepPayload
from pytrio.protocol.actor.events.trainer.save import TrainerSavePayload

from searchr1.core.objective import LOSS_CONFIG_DEFAULTS, LossConfigError, resolve_loss_config
from searchr1.twin.optimizer import AdamState, adam_step
from searchr1.twin.policy import PolicySample, Reduction, Totals, TwinPolicy
from searchr1.twin.store import STATE, WEIGHTS, CheckpointStore, RunConfig

Accumulation = Literal["sum", "mean"]
SUPPORTED_LOSSES = tuple(LOSS_CONFIG_DEFAULTS)
CHECKPOINT_EXISTS_CODE = "twin.checkpoint_exists"
UNSUPPORTED_LOSS_CODE = "twin.unsupported_loss"
UNSUPPORTED_LOSS_CONFIG_CODE = "twin.unsupported_loss_config"


class EventFailure(Exception):
    """An event the twin accepted fails with this code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Source:
    """Where a run's weights come from at ``init_run``."""

    checkpoint_uri: str = ""
    restore_optimizer: bool = False


class TrainingRun:
    def __init__(self, *, cuid: str, session: str, config: RunConfig, model_id: str, source: Source) -> None:
        self.cuid = cuid
        self.session = session
        self.config = config
        self.model_id = model_id
        self.source = source
        self.lock = threading.RLock()
        self.initialized = False
        self.broken: str | None = None
        self.params: np.ndarray | None = None
        self.adam: AdamState | None = None
        self.version = 0  # weight-changing optimiser steps since the base model
        self.lineage = cuid
        self.pending: dict[int, np.ndarray] = {}  # call step -> summed chunk gradients
        self.optimizer_steps = 0
        self.last_logprobs: list[np.ndarray] = []  # the learner's logprobs of the last forward's samples

    # --- init -------------------------------------------------------------------------

    def init(self, policy: TwinPolicy, store: CheckpointStore) -> dict[str, object]:
        if self.initialized:
            raise EventFailure("twin.already_initialized", f"training run {self.cuid} is already initialised")
        if self.source.checkpoint_uri:
            checkpoint = store.load(self.source.checkpoint_uri)
            if checkpoint.config.policy_kind != policy.kind:
                raise EventFailure(
                    "twin.policy_mismatch",
                    f"checkpoint {checkpoint.path} holds {checkpoint.config.policy_kind!r} params; "
                    f"this twin serves {policy.kind!r}",
                )
            self.params = checkpoint.params
            self.version, self.lineage = checkpoint.version, checkpoint.lineage
            if self.source.restore_optimizer:
                if not checkpoint.has_optimizer:
                    raise EventFailure(
                        "twin.no_optimizer_state",
                        f"checkpoint {checkpoint.path} holds no optimizer state (saved for sampling)",
                    )
                m, v = checkpoint.adam_m, checkpoint.adam_v
                assert m is not None and v is not None  # a checkpoint with optimizer state holds both moments
                self.adam = AdamState(m, v, int(checkpoint.adam_step or 0))
        else:
            self.params = policy.initial_params()
        if self.adam is None:
            self.adam = AdamState.zeros_like(self.params)
        self.initialized = True
        return {"training_run_cuid": self.cuid}

    # --- forward / forward_backward ----------------------------------------------------

    def forward(
        self,
        payload: TrainerForwardBackwardPayload,
        samples: list[PolicySample],
        *,
        step: int,
        backward: bool,
        policy: TwinPolicy,
        reduction: Reduction,
        strict_config: bool = True,
    ) -> dict[str, object]:
        loss_fn = payload.loss.type.strip().lower()
        if loss_fn not in SUPPORTED_LOSSES:
            raise EventFailure(UNSUPPORTED_LOSS_CODE,
                               f"the twin computes {', '.join(SUPPORTED_LOSSES)}, not {loss_fn}")
        try:
            loss_config = resolve_loss_config(loss_fn, payload.loss.config, strict=strict_config)
        except LossConfigError as error:
            raise EventFailure(UNSUPPORTED_LOSS_CONFIG_CODE, str(error)) from None
        spec = payload.gradient_accumulation
        totals = Totals(spec.total_samples, spec.total_active_tokens, spec.total_advantage_tokens)
        assert self.params is not None
        result = policy.loss_and_grad(self.params, samples, loss_fn=loss_fn, reduction=reduction, totals=totals,
                                      loss_config=loss_config)
        if backward:
            self.pending[step] = self.pending.get(step, 0.0) + result.grad
        self.last_logprobs = list(result.logprobs)
        outputs = []
        for logprobs in result.logprobs:
            values = np.asarray(logprobs, dtype=np.float64)
            if payload.auto_shift:  # one value per input position, 0.0 for the first
                values = np.concatenate([[0.0], values])
            outputs.append({"logprobs": WireTensorData.from_numpy(values.astype(np.float32)).to_wire_value()})
        return {
            "loss_fn_outputs": outputs,
            "metrics": {
                "loss_sum": float(result.loss_sum),
                "loss_mean": float(result.loss_sum / result.token_count) if result.token_count else 0.0,
                "token_count": int(result.token_count),
            },
        }

    # --- optimiser ----------------------------------------------------------------------

    def accumulated_gradient(self, accumulation: Accumulation) -> np.ndarray | None:
        if not self.pending:
            return None
        grads = list(self.pending.values())
        total = np.sum(grads, axis=0)
        return total / len(grads) if accumulation == "mean" else total

    def optimize(self, payload: TrainerOptimizeStepPayload, accumulation: Accumulation) -> dict[str, object]:
        grad = self.accumulated_gradient(accumulation)
        self.pending = {}
        self.optimizer_steps += 1
        if grad is None:
            return {"metrics": {"grad_norm": 0.0}}
        assert self.params is not None and self.adam is not None
        update = adam_step(self.params, grad, self.adam, payload.adam_params)
        if not np.array_equal(update.params, self.params):
            self.version += 1
        self.params, self.adam = update.params, update.state
        return {"metrics": {"grad_norm": update.grad_norm}}

    # --- checkpoints --------------------------------------------------------------------

    def save(self, payload: TrainerSavePayload, kind: str, store: CheckpointStore,
             model_name: str) -> dict[str, object]:
        if kind not in (STATE, WEIGHTS):
            raise ValueError(kind)
        if store.exists(self.cuid, kind, payload.name) and not payload.overwrite:
            raise EventFailure(
                CHECKPOINT_EXISTS_CODE,
                f"checkpoint {payload.name!r} already exists in run {self.cuid}; pass overwrite=True "
                "to replace it (twin rule)",
            )
        assert self.params is not None and self.adam is not None
        adam = (self.adam.m, self.adam.v, self.adam.step) if kind == STATE else None
        path, size = store.save(self.cuid, kind, payload.name, self.config, self.params,
                                version=self.version, lineage=self.lineage, adam=adam)
        return {"checkpoint": {"uri": path, "model_id": model_name, "size_bytes": size,
                               "checkpoint_cuid": f"{self.cuid}/{kind}/{payload.name}"}}

"""The fake ``ServiceClient``: factories for training and sampling clients."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pytrio.errors.base import ValidationError
from pytrio.errors.control import ControlAPIError
from pytrio.model.limits import TrainingLimits

from ..toy_policy import REDUCTIONS, AdamState, Reduction
from ..trio_types import SamplerLike
from .faults import FakeFaults
from .sampling import FakeSamplingClient, ToySampler
from .store import Checkpoint, CheckpointStore, RunConfig
from .training import FakeTrainingClient

DEFAULT_BASE_MODEL = "Qwen/Qwen3.5-4B"
DEFAULT_NUM_BUCKETS = 16
NO_LIMITS = TrainingLimits(max_batch_size=None, max_tokens_per_request=None, max_seq_len=None)
Accumulation = Literal["sum", "mean"]

# model_path (None: the base model) -> the backend sampler behind a FakeSamplingClient
SamplerFactory = Callable[[str | None], SamplerLike]


class FakeServiceClient:
    """Offline stand-in for ``pytrio.ServiceClient`` (satisfies ``ServiceLike``).

    Args:
        home: directory holding every run and checkpoint; a new ``FakeServiceClient`` on the
            same home (in another process) resolves the same ``trio://fake/...`` paths.
        tokenizer: returned by ``get_tokenizer()``; ``len(tokenizer)`` is the vocabulary
            bound for token ids, as in pytrio.
        sampler_factory: ``factory(model_path) -> SamplerLike``, called for every sampling
            client (``model_path`` is ``None`` for the base model). Default: a
            :class:`ToySampler` over the checkpoint's toy-policy weights.
        reduction: how the fake server reduces one call (``per_token`` default,
            ``per_sample``, ``sum``); see :mod:`searchr1.toy_policy`.
        accumulation: how several ``forward_backward`` calls before one ``optim_step``
            combine (``sum`` default, or ``mean``).
        faults: :class:`FakeFaults` for chaos tests.
        limits: pytrio ``TrainingLimits`` enforced client-side and used to split calls
            (default: none, so every call is one chunk).
        supported_models: base models the fake "catalog" knows.
        num_buckets: size ``K`` of the toy policy's ``K x K`` table.
    """

    def __init__(
        self,
        *,
        home: str | os.PathLike[str],
        tokenizer: Any,
        sampler_factory: SamplerFactory | None = None,
        reduction: Reduction = "per_token",
        accumulation: Accumulation = "sum",
        faults: FakeFaults | None = None,
        limits: TrainingLimits = NO_LIMITS,
        supported_models: Sequence[str] = (DEFAULT_BASE_MODEL,),
        num_buckets: int = DEFAULT_NUM_BUCKETS,
    ) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
        if accumulation not in ("sum", "mean"):
            raise ValueError(f"unknown accumulation {accumulation!r}; expected 'sum' or 'mean'")
        self.store = CheckpointStore(home)
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.sampler_factory = sampler_factory
        self.reduction: Reduction = reduction
        self.accumulation: Accumulation = accumulation
        self.faults = faults or FakeFaults()
        self.limits = limits
        self.supported_models = list(supported_models)
        self.num_buckets = num_buckets
        self._calls: Counter[str] = Counter()

    # --- internals shared with the clients ---------------------------------------------

    def _count(self, kind: str) -> int:
        """Number (from 1) of this call among all calls of ``kind`` on this service."""
        self._calls[kind] += 1
        return self._calls[kind]

    def base_weights(self, base_model: str) -> np.ndarray:
        """The frozen "base model": a table drawn from a seed derived from its name."""
        seed = int.from_bytes(hashlib.sha256(base_model.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).normal(
            0.0, 1.0, size=(self.num_buckets, self.num_buckets)
        )

    def _check_model(self, base_model: str) -> None:
        if base_model not in self.supported_models:
            raise ControlAPIError(
                f"model {base_model!r} is not in the fake catalog {self.supported_models}",
                status_code=404,
                code="model_not_found",
            )

    def _adam_from(self, checkpoint: Checkpoint) -> AdamState:
        if checkpoint.adam_m is None or checkpoint.adam_v is None or checkpoint.adam_step is None:
            raise ControlAPIError(
                f"checkpoint {checkpoint.path!r} holds no optimizer state (saved for sampling)",
                status_code=400,
                code="fake.no_optimizer_state",
            )
        return AdamState(checkpoint.adam_m, checkpoint.adam_v, checkpoint.adam_step)

    def _make_sampling_client(self, base_model: str, model_path: str | None) -> FakeSamplingClient:
        self._check_model(base_model)
        checkpoint = self.store.load(model_path) if model_path is not None else None
        if self.sampler_factory is not None:
            backend = self.sampler_factory(model_path)
        else:
            delta = checkpoint.params if checkpoint is not None else 0.0
            backend = ToySampler(
                self.base_weights(base_model) + delta,
                vocab_size=self.vocab_size,
                tokenizer=self.tokenizer,
                model_id=base_model,
            )
        number = self._count("sampling_client")
        return FakeSamplingClient(
            backend,
            model_id=base_model,
            model_path=model_path,
            sampling_run_cuid=f"fake-sampling-{number:04d}",
            tokenizer=self.tokenizer,
            next_sample_call=lambda: self._count("sample") in self.faults.fail_sample_calls,
        )

    def _new_training_client(
        self, config: RunConfig, checkpoint: Checkpoint | None, with_optimizer: bool
    ) -> FakeTrainingClient:
        run_id = self.store.new_run(config)
        shape = (config.num_buckets, config.num_buckets)
        params = checkpoint.params if checkpoint is not None else np.zeros(shape)
        adam = (
            self._adam_from(checkpoint)
            if checkpoint is not None and with_optimizer
            else AdamState.zeros_like(params)
        )
        return FakeTrainingClient(
            self,
            run_id=run_id,
            config=config,
            params=params,
            adam=adam,
            source_path=checkpoint.path if checkpoint is not None else None,
        )

    # --- the ServiceClient API ----------------------------------------------------------

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
    ) -> FakeTrainingClient:
        """A fresh LoRA run: the delta starts at zero, so the policy starts as the base
        model (as LoRA does); ``seed`` is recorded only."""
        if rank not in range(4, 65):
            raise ValidationError(
                f"rank must be in [4, 64]. Got {rank}", code="validation.invalid_lora_rank"
            )
        self._check_model(base_model)
        config = RunConfig(
            base_model=base_model,
            lora_rank=rank,
            seed=seed,
            train_mlp=train_mlp,
            train_attn=train_attn,
            train_unembed=train_unembed,
            num_buckets=self.num_buckets,
            vocab_size=self.vocab_size,
        )
        return self._new_training_client(config, None, with_optimizer=False)

    async def create_lora_training_client_async(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
    ) -> FakeTrainingClient:
        return self.create_lora_training_client(
            base_model, rank, seed, train_mlp, train_attn, train_unembed
        )

    def _from_state(self, path: str, with_optimizer: bool) -> FakeTrainingClient:
        checkpoint = self.store.load(path)
        config = checkpoint.config
        if config.num_buckets != self.num_buckets or config.vocab_size != self.vocab_size:
            raise ValueError(
                f"checkpoint {path!r} was saved by a fake with num_buckets={config.num_buckets}, "
                f"vocab_size={config.vocab_size}; this one has {self.num_buckets}, {self.vocab_size}"
            )
        self._check_model(config.base_model)
        return self._new_training_client(config, checkpoint, with_optimizer)

    def create_training_client_from_state(self, path: str) -> FakeTrainingClient:
        """Weights only: the optimiser starts fresh."""
        return self._from_state(path, with_optimizer=False)

    async def create_training_client_from_state_async(self, path: str) -> FakeTrainingClient:
        return self.create_training_client_from_state(path)

    def create_training_client_from_state_with_optimizer(self, path: str) -> FakeTrainingClient:
        """Weights, Adam moments and step count: training continues bit for bit."""
        return self._from_state(path, with_optimizer=True)

    async def create_training_client_from_state_with_optimizer_async(
        self, path: str
    ) -> FakeTrainingClient:
        return self.create_training_client_from_state_with_optimizer(path)

    def create_sampling_client(
        self, base_model: str, model_path: str | None = None
    ) -> FakeSamplingClient:
        return self._make_sampling_client(base_model, model_path)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> FakeSamplingClient:
        return self.create_sampling_client(base_model, model_path)

    def get_supported_models(self) -> list[str]:
        return list(self.supported_models)

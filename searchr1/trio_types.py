"""The slice of the PyTRIO 0.2.9 client API that ``searchr1`` uses, as structural Protocols.

Why Protocols: the training loop must run unchanged against the real SDK (billed, remote),
against the offline fake in :mod:`searchr1.fake_trio` (tests, demos), and against the lead's
scripted sampler. Typing the loop against these Protocols instead of ``pytrio.ServiceClient``
keeps every one of them a drop-in replacement, and a type checker proves it.

Rules (``pytrio-sdk.md`` §16):

* Data types are pytrio's own pydantic types (``Datum``, ``ModelInput``, ``SamplingParams``,
  ``AdamParams``, the response types); they construct offline.
* Parameter names and defaults match pytrio exactly, so keyword calls work on both sides.
* Futures: use only ``.result()`` and ``await fut``. Trainer ``*_async`` methods return a
  coroutine that resolves to a *future* (await twice); ``SamplerLike.sample_async`` and the
  ``save_weights_and_get_sampling_client_async`` factory resolve to the value (await once).
* ``get_tokenizer()`` returns ``Any`` (pytrio says ``object``); cast it to ``TokenizerLike``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol, TypeVar, runtime_checkable

from pytrio.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    ModelInput,
    OptimStepResponse,
    SampleResponse,
    SamplingParams,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)

T_co = TypeVar("T_co", covariant=True)

# pytrio's own default, shared so that the Protocol signatures read like the SDK's.
DEFAULT_SAMPLING_PARAMS = SamplingParams()


@runtime_checkable
class FutureLike(Protocol[T_co]):
    """What ``pytrio.types.APIFuture`` offers and the loop may rely on."""

    def result(self, timeout: float | None = None) -> T_co: ...

    def done(self) -> bool: ...

    def __await__(self) -> Generator[Any, None, T_co]: ...


class TokenizerLike(Protocol):
    """The tokenizer surface the project needs (transformers tokenizers satisfy it)."""

    eos_token_id: int | None

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str: ...

    def __len__(self) -> int: ...


class SamplerLike(Protocol):
    @property
    def model_id(self) -> str: ...

    def sample(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> FutureLike[SampleResponse]: ...

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse: ...

    def compute_logprobs(self, prompt: ModelInput) -> FutureLike[list[float | None]]: ...

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]: ...

    def get_tokenizer(self) -> Any: ...


class TrainerLike(Protocol):
    @property
    def model_id(self) -> str: ...

    def forward(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> FutureLike[ForwardBackwardOutput]: ...

    def forward_backward(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> FutureLike[ForwardBackwardOutput]: ...

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> FutureLike[ForwardBackwardOutput]: ...

    def optim_step(self, adam_params: AdamParams) -> FutureLike[OptimStepResponse]: ...

    async def optim_step_async(self, adam_params: AdamParams) -> FutureLike[OptimStepResponse]: ...

    def save_state(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> FutureLike[SaveWeightsResponse]: ...

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None
    ) -> FutureLike[SaveWeightsForSamplerResponse]: ...

    def save_weights_and_get_sampling_client(self) -> SamplerLike: ...

    async def save_weights_and_get_sampling_client_async(self) -> SamplerLike: ...

    def create_sampling_client(self, model_path: str) -> SamplerLike: ...

    def load_state(self, path: str) -> FutureLike[dict[str, object]]: ...

    def load_state_with_optimizer(self, path: str) -> FutureLike[dict[str, object]]: ...

    def get_tokenizer(self) -> Any: ...


class ServiceLike(Protocol):
    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
    ) -> TrainerLike: ...

    def create_training_client_from_state(self, path: str) -> TrainerLike: ...

    def create_training_client_from_state_with_optimizer(self, path: str) -> TrainerLike: ...

    def create_sampling_client(
        self, base_model: str, model_path: str | None = None
    ) -> SamplerLike: ...

    def get_supported_models(self) -> list[str]: ...

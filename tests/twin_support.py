"""Helpers for tests that run the real pytrio client against the twin."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pytrio.types import Datum, ModelInput, SamplingParams, TensorData

from searchr1.twin import Twin, start_twin
from searchr1.twin.client import FAST_RETRIES

MODEL = "Qwen/Qwen3.5-4B"
PROMPT = "Question: what is the capital of France?\nAnswer:"


@contextmanager
def running_twin(home: Path, tokenizer: Any, **options: Any) -> Iterator[tuple[Twin, Any]]:
    """A twin and a real ServiceClient on it with millisecond retries."""
    with start_twin(home=home, tokenizer=tokenizer, **{"policy": "toy", **options}) as twin:
        yield twin, twin.service_client(sdk_options=FAST_RETRIES)


def sample_once(sampler: Any, prompt: list[int], *, max_tokens: int = 6, seed: int = 1,
                num_samples: int = 1, stop: Any = None) -> Any:
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop=stop)
    return sampler.sample(ModelInput.from_ints(prompt), num_samples=num_samples, sampling_params=params).result()


def datum_from(prompt: list[int], tokens: list[int], logprobs: list[float], *, advantage: float = 1.0) -> Datum:
    """The trainer's layout: one shifted datum, advantage and sampler logprobs on the sampled tokens."""
    sequence = list(prompt) + list(tokens)
    is_action = np.arange(1, len(sequence)) >= len(prompt)
    old = np.zeros(len(sequence) - 1, dtype=np.float32)
    old[len(prompt) - 1:] = np.asarray(logprobs, dtype=np.float32)
    return Datum(
        model_input=ModelInput.from_ints(sequence[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(np.asarray(sequence[1:], dtype=np.int64)),
            "logprobs": TensorData.from_numpy(old),
            "advantages": TensorData.from_numpy(np.where(is_action, advantage, 0.0).astype(np.float32)),
        },
    )


def sampled_datum(sampler: Any, prompt: list[int], *, advantage: float = 1.0, **kwargs: Any) -> Datum:
    sequence = sample_once(sampler, prompt, **kwargs).sequences[0]
    return datum_from(prompt, list(sequence.tokens), list(sequence.logprobs), advantage=advantage)

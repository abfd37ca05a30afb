"""The offline fake behaves like pytrio 0.2.9 where pytrio is known."""

from __future__ import annotations

import hashlib
import inspect
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import pytrio
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.base import PyTrioError, ValidationError
from pytrio.errors.control import ControlAPIError
from pytrio.errors.event import EventFailedError
from pytrio.model.limits import TrainingLimits
from pytrio.types import (
    AdamParams,
    APIFuture,
    Datum,
    ModelInput,
    SampleResponse,
    SamplingParams,
)
from training_strategies import VOCAB_SIZE, StubTokenizer

from searchr1.fake_trio import (
    CHECKPOINT_EXISTS_CODE,
    INJECTED_FAILURE_CODE,
    UNSUPPORTED_LOSS_CODE,
    FakeFaults,
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
)
from searchr1.probe_loss import policy_datum
from searchr1.toy_policy import token_logprobs
from searchr1.trio_types import FutureLike

MODEL = "Qwen/Qwen3.5-4B"
TOKENS = [101, 202, 303, 404, 505, 606, 707]
LR = AdamParams(learning_rate=0.05)


@pytest.fixture
def service(tmp_path):
    return FakeServiceClient(home=tmp_path, tokenizer=StubTokenizer())


@pytest.fixture
def trainer(service):
    return service.create_lora_training_client(MODEL)


def datum(tokens=TOKENS, action_start=4, advantage=1.0, **kwargs):
    return policy_datum(tokens, action_start, advantage=advantage, **kwargs)


def raw_datum(inputs, targets, logprobs=None, advantages=None):
    n = len(inputs)
    return Datum(
        model_input=ModelInput.from_ints(inputs),
        loss_fn_inputs={
            "target_tokens": targets,
            "logprobs": np.zeros(n, np.float32) if logprobs is None else logprobs,
            "advantages": np.ones(n, np.float32) if advantages is None else advantages,
        },
    )


# --- signatures --------------------------------------------------------------------------


def public_methods(cls):
    return {n for n, m in vars(cls).items() if callable(m) and not n.startswith("_")}


@pytest.mark.parametrize(
    "real, fake, names",
    [
        (pytrio.TrainingClient, FakeTrainingClient, None),
        (pytrio.SamplingClient, FakeSamplingClient, None),
        (
            pytrio.ServiceClient,
            FakeServiceClient,
            {
                "create_lora_training_client",
                "create_lora_training_client_async",
                "create_training_client_from_state",
                "create_training_client_from_state_async",
                "create_training_client_from_state_with_optimizer",
                "create_training_client_from_state_with_optimizer_async",
                "create_sampling_client",
                "create_sampling_client_async",
                "get_supported_models",
            },
        ),
    ],
)
def test_signatures_and_async_shapes_match_pytrio(real, fake, names):
    names = names or (
        public_methods(real) - {"forward_backward_custom", "forward_backward_custom_async"}
    )
    for name in sorted(names):
        real_method, fake_method = getattr(real, name), getattr(fake, name)
        real_params = [
            (p.name, p.kind, p.default) for p in inspect.signature(real_method).parameters.values()
        ]
        fake_params = [
            (p.name, p.kind, p.default) for p in inspect.signature(fake_method).parameters.values()
        ]
        assert fake_params == real_params, name
        assert inspect.iscoroutinefunction(fake_method) == inspect.iscoroutinefunction(
            real_method
        ), name


# --- validation: the fake rejects what pytrio rejects ------------------------------------


@pytest.mark.parametrize("rank", [3, 65, 0, -1])
def test_lora_rank_outside_4_to_64_is_rejected(service, rank):
    with pytest.raises(ValidationError) as caught:
        service.create_lora_training_client(MODEL, rank=rank)
    assert caught.value.code == "validation.invalid_lora_rank"


@pytest.mark.parametrize("rank", [4, 32, 64])
def test_lora_rank_inside_4_to_64_is_accepted(service, rank):
    assert service.create_lora_training_client(MODEL, rank=rank).lora.rank == rank


def test_unknown_base_model_is_a_control_error(service):
    with pytest.raises(ControlAPIError) as caught:
        service.create_lora_training_client("no/such-model")
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(
    "data, error, code_or_message",
    [
        ([], ValidationError, "validation.empty_training_data"),
        (
            [raw_datum([1, 2], np.array([2.0, 3.0]))],
            ValueError,
            "target_tokens must have dtype int64",
        ),
        ([raw_datum([1, VOCAB_SIZE], [2, 3])], ValidationError, "validation.token_id_out_of_range"),
        ([raw_datum([1, -1], [2, 3])], ValidationError, "validation.token_id_out_of_range"),
        ([raw_datum([1, 2], [2, VOCAB_SIZE])], ValidationError, "validation.token_id_out_of_range"),
        ([raw_datum([1, 2], [2, -7])], ValidationError, "validation.token_id_out_of_range"),
        ([raw_datum([1, 2], [2, 3, 4])], ValueError, "target_tokens must have shape [2]"),
        (
            [raw_datum([1, 2], [2, 3], logprobs=[0.0, float("nan")])],
            ValueError,
            "logprobs[1] must be finite",
        ),
        (
            [Datum(model_input=ModelInput.from_ints([1]), loss_fn_inputs={"target_tokens": [2]})],
            ValueError,
            "logprobs is required",
        ),
    ],
)
def test_invalid_training_data_is_rejected_synchronously(
    service, trainer, data, error, code_or_message
):
    path = service.create_lora_training_client(MODEL).save_state("elsewhere").result().path
    with pytest.raises(error) as caught:
        trainer.forward_backward(data, loss_fn="importance_sampling")
    assert code_or_message in (getattr(caught.value, "code", "") + " " + str(caught.value))
    # a rejected call is not a training operation: load_state is still allowed afterwards
    assert trainer.load_state(path).result() == {}


def test_ignore_index_targets_are_accepted_and_not_counted(trainer):
    out = trainer.forward(
        [raw_datum([1, 2, 3], [2, -100, 4])], loss_fn="importance_sampling"
    ).result()
    assert out.metrics["token_count"] == 2.0


def test_unknown_loss_is_a_value_error_and_unimplemented_policy_losses_fail_in_the_future(trainer):
    with pytest.raises(ValueError, match="Unsupported loss function type: hinge"):
        trainer.forward_backward([datum()], loss_fn="hinge")
    future = trainer.forward_backward([datum()], loss_fn="ppo")
    with pytest.raises(EventFailedError) as caught:
        future.result()
    assert caught.value.code == UNSUPPORTED_LOSS_CODE


def test_limits_reject_a_too_long_sample(tmp_path):
    service = FakeServiceClient(
        home=tmp_path,
        tokenizer=StubTokenizer(),
        limits=TrainingLimits(max_batch_size=None, max_tokens_per_request=None, max_seq_len=3),
    )
    with pytest.raises(ValidationError) as caught:
        service.create_lora_training_client(MODEL).forward([datum()], loss_fn="importance_sampling")
    assert caught.value.code == "validation.training_sample_too_long"


@pytest.mark.parametrize("name", ["", "a/b", "trailing.", "-lead", "ümlaut", ".hidden", "a\tb"])
def test_bad_checkpoint_names_are_rejected(trainer, name):
    for save in (trainer.save_state, trainer.save_weights_for_sampler):
        with pytest.raises(ValidationError) as caught:
            save(name)
        assert caught.value.code == "validation.invalid_checkpoint_name"


def test_spaces_become_hyphens_and_long_names_are_hashed(trainer):
    assert (
        trainer.save_state("step 1 of 2").result().path == "trio://fake/run-0001/state/step-1-of-2"
    )
    long_name = "n" * 150 + " " + "m" * 99
    normalized = long_name.replace(" ", "-")
    expected = normalized[:180] + hashlib.sha256(normalized.encode("ascii")).hexdigest()[:20]
    path = trainer.save_weights_for_sampler(long_name).result().path
    assert path == f"trio://fake/run-0001/weights/{expected}" and len(expected) == 200


def sampling_calls(sampler):
    prompt = ModelInput.from_ints([1, 2, 3])
    return [
        lambda **kw: sampler.sample(kw.pop("prompt", prompt), **kw),
        lambda **kw: _run(sampler.sample_async(kw.pop("prompt", prompt), **kw)),
    ]


def _run(coroutine):
    import asyncio

    return asyncio.run(coroutine)


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({}, "validation.invalid_sampling_request"),  # default SamplingParams has no max_tokens
        ({"sampling_params": SamplingParams(max_tokens=0)}, "validation.invalid_sampling_request"),
        (
            {"sampling_params": SamplingParams(max_tokens=4), "num_samples": 0},
            "validation.invalid_sampling_request",
        ),
        (
            {"sampling_params": SamplingParams(max_tokens=4), "prompt": ModelInput.from_ints([])},
            "validation.empty_prompt",
        ),
    ],
)
def test_sampling_requests_are_validated_like_pytrio(service, kwargs, code):
    sampler = service.create_sampling_client(MODEL)
    for call in sampling_calls(sampler):
        with pytest.raises(ValidationError) as caught:
            call(**dict(kwargs))
        assert caught.value.code == code


# --- futures -----------------------------------------------------------------------------


async def test_trainer_async_methods_resolve_to_futures_and_samplers_to_values(trainer):
    first = await trainer.forward_backward_async([datum()], loss_fn="importance_sampling")
    assert isinstance(first, APIFuture) and isinstance(first, FutureLike)
    output = await first
    assert output.metrics["token_count"] == len(TOKENS) - 1
    step = await (await trainer.optim_step_async(LR))
    assert "grad_norm" in step.metrics
    saved = await (await trainer.save_state_async("s"))
    assert saved.path.endswith("/state/s")
    sampler = await trainer.save_weights_and_get_sampling_client_async()
    assert isinstance(sampler, FakeSamplingClient)
    response = await sampler.sample_async(
        ModelInput.from_ints([5]), sampling_params=SamplingParams(max_tokens=3)
    )
    assert isinstance(response, SampleResponse)
    assert (
        sampler.sample(ModelInput.from_ints([5]), sampling_params=SamplingParams(max_tokens=3))
        .result()
        .sequences
    )


# --- honest numbers ------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=2, max_size=20), st.data())
def test_metrics_are_aggregated_as_pytrio_does(tmp_path_factory, tokens, data):
    targets = [t if data.draw(st.booleans()) else -100 for t in tokens[1:]]
    service = FakeServiceClient(
        home=tmp_path_factory.mktemp("m"),
        tokenizer=StubTokenizer(),
        limits=TrainingLimits(max_batch_size=1, max_tokens_per_request=None, max_seq_len=None),
    )
    trainer = service.create_lora_training_client(MODEL)
    d = raw_datum(tokens[:-1], targets, advantages=np.full(len(targets), 0.5, np.float32))
    out = trainer.forward([d, d], loss_fn="importance_sampling").result()
    active = sum(t != -100 for t in targets)
    assert out.metrics["token_count"] == 2 * active
    assert out.metrics["loss_mean"] == (out.metrics["loss_sum"] / (2 * active) if active else 0.0)
    assert set(out.metrics) == {"loss_sum", "loss_mean", "token_count"}
    logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert len(logprobs) == len(targets) and all(
        v == 0.0 for v, t in zip(logprobs, targets) if t == -100
    )


@pytest.mark.parametrize("advantage, direction", [(1.0, 1), (-1.0, -1)])
def test_an_update_moves_action_logprobs_in_the_direction_of_the_advantage(
    trainer, advantage, direction
):
    d = datum(advantage=advantage)
    inputs, targets = np.array(TOKENS[:-1]), np.array(TOKENS[1:])
    before = token_logprobs(trainer.weights, VOCAB_SIZE, inputs, targets)[3:].sum()
    trainer.forward_backward([d], loss_fn="importance_sampling").result()
    trainer.optim_step(AdamParams(learning_rate=0.01)).result()
    after = token_logprobs(trainer.weights, VOCAB_SIZE, inputs, targets)[3:].sum()
    assert np.sign(after - before) == direction


def test_auto_shift_skips_the_first_label_in_counts(trainer):
    d = raw_datum(TOKENS, TOKENS)
    assert (
        trainer.forward([d], loss_fn="importance_sampling", auto_shift=True)
        .result()
        .metrics["token_count"]
        == len(TOKENS) - 1
    )


def test_an_optim_step_without_gradients_changes_nothing(trainer):
    before = trainer.weights.copy()
    assert trainer.optim_step(LR).result().metrics == {"grad_norm": 0.0}
    assert np.array_equal(trainer.weights, before) and trainer.adam_state.step == 0


# --- load_state rules ----------------------------------------------------------------------


def test_load_state_only_before_the_first_operation(service, trainer):
    path = trainer.save_state("a").result().path
    with pytest.raises(ValidationError) as caught:
        trainer.load_state(path)
    assert caught.value.code == "validation.already_initialized"
    fresh = service.create_lora_training_client(MODEL)
    assert fresh.load_state(path).result() == {}


def test_load_state_rejects_a_mismatched_configuration(service, trainer):
    path = trainer.save_state("a").result().path
    other = service.create_lora_training_client(MODEL, rank=16, train_attn=False)
    with pytest.raises(ValidationError) as caught:
        other.load_state_with_optimizer(path)
    assert caught.value.code == "validation.checkpoint_config_mismatch"
    assert {m["field"] for m in caught.value.details["mismatches"]} == {"lora_rank", "train_attn"}


def test_unknown_checkpoint_paths_are_control_errors(service):
    for path in ("trio://fake/run-9999/state/x", "s3://elsewhere"):
        with pytest.raises(ControlAPIError):
            service.create_training_client_from_state(path)


def test_saving_under_an_existing_name_needs_overwrite(trainer):
    trainer.save_state("same").result()
    with pytest.raises(EventFailedError) as caught:
        trainer.save_state("same").result()
    assert caught.value.code == CHECKPOINT_EXISTS_CODE
    assert trainer.save_state("same", overwrite=True).result().path.endswith("/state/same")


# --- persistence and resume ----------------------------------------------------------------


def train(trainer, steps, lr=0.05, start=0):
    """``steps`` updates; the data of update ``k`` depends on ``k`` (counted from ``start``)."""
    for k in range(start, start + steps):
        trainer.forward_backward(
            [datum(advantage=1.0 + k), datum(TOKENS[::-1], 2, -0.5)], loss_fn="importance_sampling"
        ).result()
        trainer.optim_step(AdamParams(learning_rate=lr, weight_decay=0.01)).result()


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 3), st.integers(1, 3), st.floats(1e-3, 0.2))
def test_save_and_resume_on_a_fresh_service_continues_identically(
    tmp_path_factory, before, after, lr
):
    home = tmp_path_factory.mktemp("home")
    first = FakeServiceClient(home=home, tokenizer=StubTokenizer())
    trainer = first.create_lora_training_client(MODEL)
    train(trainer, before, lr)
    path = trainer.save_state("resume-here").result().path
    train(trainer, after, lr, start=before)
    second = FakeServiceClient(home=home, tokenizer=StubTokenizer())
    resumed = second.create_training_client_from_state_with_optimizer(path)
    assert resumed.adam_state.step == before
    train(resumed, after, lr, start=before)
    assert np.array_equal(resumed.weights, trainer.weights)
    assert np.array_equal(resumed.adam_state.m, trainer.adam_state.m)
    assert resumed.adam_state.step == trainer.adam_state.step
    weights_only = second.create_training_client_from_state(path)
    assert weights_only.adam_state.step == 0


def test_a_checkpoint_survives_sigkill_and_a_new_process_continues_bit_for_bit(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_fake_trio import train, MODEL
        from training_strategies import StubTokenizer
        from searchr1.fake_trio import FakeServiceClient
        trainer = FakeServiceClient(home={str(tmp_path / "home")!r}, tokenizer=StubTokenizer()).create_lora_training_client(MODEL)
        train(trainer, 2)
        print(trainer.save_state("step-2").result().path, flush=True)
        train(trainer, 1, start=2)  # progress after the checkpoint is lost
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    path = child.stdout.strip()
    resumed = FakeServiceClient(
        home=tmp_path / "home", tokenizer=StubTokenizer()
    ).create_training_client_from_state_with_optimizer(path)
    train(resumed, 1, start=2)
    reference = FakeServiceClient(
        home=tmp_path / "reference", tokenizer=StubTokenizer()
    ).create_lora_training_client(MODEL)
    train(reference, 3)
    assert np.array_equal(resumed.weights, reference.weights)
    assert resumed.adam_state.step == reference.adam_state.step == 3


def test_checkpoint_paths_are_deterministic_per_home(tmp_path):
    paths = []
    for home in (tmp_path / "a", tmp_path / "b"):
        service = FakeServiceClient(home=home, tokenizer=StubTokenizer())
        trainer = service.create_lora_training_client(MODEL)
        paths.append(
            (
                trainer.save_state("x").result().path,
                trainer.save_weights_and_get_sampling_client().model_path,
            )
        )
    assert paths[0] == paths[1]
    assert paths[0][0] == "trio://fake/run-0001/state/x"
    assert paths[0][1].startswith("trio://fake/run-0001/weights/temp-sampling-")


# --- samplers and tokenizers ---------------------------------------------------------------


class ScriptedSampler:
    """Stands in for the lead's scenario sampler; accepts anything."""

    model_id = MODEL

    def __init__(self, path):
        self.path = path

    def sample(
        self,
        prompt,
        num_samples=1,
        sampling_params=None,
        include_prompt_logprobs=False,
        topk_prompt_logprobs=0,
        return_text=True,
    ):
        from pytrio.types import SampleSequence

        return APIFuture.completed(
            SampleResponse(
                sequences=[
                    SampleSequence(stop_reason="stop", tokens=[9], text="hi", logprobs=[-0.5])
                ]
                * num_samples
            )
        )

    async def sample_async(self, *args, **kwargs):
        return self.sample(*args, **kwargs).result()


def test_the_sampler_factory_gets_the_checkpoint_path_and_its_sampler_is_validated(tmp_path):
    made = []
    service = FakeServiceClient(
        home=tmp_path,
        tokenizer=StubTokenizer(),
        sampler_factory=lambda path: made.append(path) or ScriptedSampler(path),
    )
    trainer = service.create_lora_training_client(MODEL)
    sampler = trainer.save_weights_and_get_sampling_client()
    assert made == [sampler.model_path] and sampler.backend.path == sampler.model_path
    assert made[0].startswith("trio://fake/run-0001/weights/temp-sampling-")
    params = SamplingParams(max_tokens=5)
    assert (
        sampler.sample(ModelInput.from_ints([1]), num_samples=2, sampling_params=params)
        .result()
        .sequences[0]
        .text
        == "hi"
    )
    with pytest.raises(ValidationError):
        sampler.sample(
            ModelInput.from_ints([1])
        )  # no max_tokens, even though the script would not care
    base = service.create_sampling_client(MODEL)
    assert made[-1] is None and base.model_path is None


def test_get_tokenizer_returns_the_injected_tokenizer(tmp_path, tokenizer):
    service = FakeServiceClient(home=tmp_path, tokenizer=tokenizer)
    trainer = service.create_lora_training_client(MODEL)
    sampler = trainer.save_weights_and_get_sampling_client()
    assert trainer.get_tokenizer() is tokenizer and sampler.get_tokenizer() is tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    response = sampler.sample(
        ModelInput.from_ints(tokenizer.encode("Hello")),
        num_samples=3,
        sampling_params=SamplingParams(max_tokens=40, stop=[im_end], seed=7),
    ).result()
    for sequence in response.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) <= 40
        assert sequence.text == tokenizer.decode(sequence.tokens)
        assert sequence.stop_reason == ("stop" if sequence.tokens[-1] == im_end else "length")
        assert all(t < len(tokenizer) for t in sequence.tokens)


# --- fault injection -------------------------------------------------------------------------


def test_an_injected_forward_backward_failure_fails_only_that_call(tmp_path):
    service = FakeServiceClient(
        home=tmp_path, tokenizer=StubTokenizer(), faults=FakeFaults(fail_forward_backward_calls={2})
    )
    trainer = service.create_lora_training_client(MODEL)
    trainer.forward_backward([datum()], loss_fn="importance_sampling").result()
    once = trainer.accumulated_gradient.copy()
    failing = trainer.forward_backward([datum()], loss_fn="importance_sampling")
    with pytest.raises(EventFailedError) as caught:
        failing.result()
    assert caught.value.code == INJECTED_FAILURE_CODE
    assert np.array_equal(trainer.accumulated_gradient, once)
    trainer.forward_backward([datum()], loss_fn="importance_sampling").result()
    assert np.allclose(trainer.accumulated_gradient, 2 * once) and not trainer.broken


def test_a_broken_run_refuses_every_later_call_and_recovers_from_a_checkpoint(tmp_path):
    service = FakeServiceClient(
        home=tmp_path,
        tokenizer=StubTokenizer(),
        faults=FakeFaults(break_run_on_forward_backward_calls={2}),
    )
    trainer = service.create_lora_training_client(MODEL)
    train(trainer, 1)
    path = trainer.save_state("last-good").result().path
    with pytest.raises(EventFailedError):
        trainer.forward_backward([datum()], loss_fn="importance_sampling").result()
    for call in (
        lambda: trainer.forward_backward([datum()], loss_fn="importance_sampling"),
        lambda: trainer.forward([datum()], loss_fn="importance_sampling"),
        lambda: trainer.optim_step(LR),
        lambda: trainer.save_state("after"),
        lambda: trainer.save_weights_and_get_sampling_client(),
    ):
        with pytest.raises(PyTrioError) as caught:
            call()
        assert caught.value.code == "training.run_broken" and not caught.value.retryable
    rebuilt = service.create_training_client_from_state_with_optimizer(path)
    train(rebuilt, 1, start=1)
    assert rebuilt.adam_state.step == 2


async def test_injected_optimizer_and_sampling_failures(tmp_path):
    service = FakeServiceClient(
        home=tmp_path,
        tokenizer=StubTokenizer(),
        faults=FakeFaults(fail_optim_step_calls={1}, fail_sample_calls={1, 3}),
    )
    trainer = service.create_lora_training_client(MODEL)
    trainer.forward_backward([datum()], loss_fn="importance_sampling").result()
    with pytest.raises(EventFailedError):
        trainer.optim_step(LR).result()
    assert trainer.adam_state.step == 0 and np.any(trainer.accumulated_gradient)
    trainer.optim_step(LR).result()
    assert trainer.adam_state.step == 1
    sampler = service.create_sampling_client(MODEL)
    prompt, params = ModelInput.from_ints([1, 2]), SamplingParams(max_tokens=2)
    with pytest.raises(ActorAPIError) as caught:
        sampler.sample(prompt, sampling_params=params).result()
    assert caught.value.retryable
    assert (await sampler.sample_async(prompt, sampling_params=params)).sequences
    with pytest.raises(ActorAPIError):
        await sampler.sample_async(prompt, sampling_params=params)


def test_fault_call_numbers_start_at_one():
    with pytest.raises(ValueError, match="start at 1"):
        FakeFaults(fail_forward_backward_calls={0})

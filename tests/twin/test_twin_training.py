"""What the twin's trainer does with what the real client sends: the toy policy's exact update,
pytrio's counting of active targets, and the server-side refusals."""

from __future__ import annotations

import numpy as np
import pytest
from pytrio.errors.control import ControlAPIError
from pytrio.errors.event import EventFailedError
from pytrio.types import AdamParams, Datum, ModelInput, TensorData
from twin_support import MODEL, PROMPT, datum_from, running_twin, sample_once

from searchr1.twin import Strictness
from searchr1.twin.toy_policy import token_logprobs

LR = AdamParams(learning_rate=0.01)
SYNTHETIC = Strictness(sampled_actions=False)  # the datums below are hand-made, never sampled


def raw(inputs, targets):
    n = len(inputs)
    return Datum(model_input=ModelInput.from_ints(inputs), loss_fn_inputs={
        "target_tokens": TensorData.from_numpy(np.asarray(targets, dtype=np.int64)),
        "logprobs": TensorData.from_numpy(np.zeros(n, np.float32)),
        "advantages": TensorData.from_numpy(np.ones(n, np.float32)),
    })


@pytest.mark.parametrize(("advantage", "direction"), [(1.0, 1), (-1.0, -1)])
def test_an_update_moves_the_sampled_tokens_logprobs_in_the_direction_of_the_advantage(
    tmp_path, tokenizer, advantage, direction
):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        prompt = tokenizer.encode(PROMPT)
        sequence = sample_once(sampler, prompt, max_tokens=6).sequences[0]
        tokens = prompt + list(sequence.tokens)
        inputs, targets = np.array(tokens[:-1]), np.array(tokens[1:])
        run = twin.training_run(trainer.training_run_cuid)

        def action_logprob():
            return token_logprobs(twin.policy.weights(run.params), len(tokenizer), inputs, targets)[len(prompt) - 1:].sum()

        before = action_logprob()
        assert before == pytest.approx(sum(sequence.logprobs), abs=1e-4)  # the sampler's own distribution
        trainer.forward_backward([datum_from(prompt, list(sequence.tokens), list(sequence.logprobs),
                                             advantage=advantage)], loss_fn="importance_sampling").result()
        trainer.optim_step(LR).result()
        assert np.sign(action_logprob() - before) == direction


def test_ignore_index_targets_and_the_auto_shifted_first_label_are_not_counted(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, strictness=SYNTHETIC) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        masked = trainer.forward([raw([1, 2, 3], [2, -100, 4])], loss_fn="importance_sampling").result()
        shifted = trainer.forward([raw([5, 6, 7, 8], [5, 6, 7, 8])], loss_fn="importance_sampling",
                                  auto_shift=True).result()
    assert masked.metrics["token_count"] == 2
    assert shifted.metrics["token_count"] == 3
    assert len(shifted.loss_fn_outputs[0]["logprobs"].data) == 4  # one value per input position


def test_an_optim_step_without_gradients_changes_nothing(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        trainer.save_state("init").result()
        run = twin.training_run(trainer.training_run_cuid)
        before = run.params.copy()
        assert trainer.optim_step(LR).result().metrics == {"grad_norm": 0.0}
        assert np.array_equal(run.params, before) and run.adam.step == 0 and run.version == 0


def test_losses_the_twin_does_not_compute_fail_in_the_future(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, strictness=SYNTHETIC) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        future = trainer.forward_backward([raw([1, 2, 3], [2, 3, 4])], loss_fn="cross_entropy")
        future.result()
        # gspo is Tinker's, not pytrio's: the SDK refuses it before the twin sees it
        with pytest.raises(ValueError):
            trainer.forward_backward([raw([1, 2, 3], [2, 3, 4])], loss_fn="gspo")


def test_strict_mode_refuses_a_loss_config_key_the_loss_does_not_take_naming_the_keys_it_takes(
        tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, strictness=SYNTHETIC) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        datum = raw([1, 2, 3], [2, 3, 4])
        with pytest.raises(EventFailedError) as failed:
            trainer.forward_backward([datum], loss_fn="ppo", loss_fn_config={"clip_ratio": 0.2}).result()
    assert failed.value.code == "twin.unsupported_loss_config"
    assert "clip_ratio" in str(failed.value) and "clip_low_threshold, clip_high_threshold" in str(failed.value)


def test_an_unknown_base_model_is_a_control_error(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (_, service):
        with pytest.raises(ControlAPIError) as refused:
            service.create_lora_training_client("no/such-model", rank=8)
    assert refused.value.code == "model_not_found" and refused.value.status_code == 404


def test_a_sampler_on_saved_weights_samples_from_those_weights(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt = tokenizer.encode(PROMPT)
        base = sample_once(service.create_sampling_client(base_model=MODEL), prompt, max_tokens=8, seed=3)
        sampler = trainer.save_weights_and_get_sampling_client()
        sequence = sample_once(sampler, prompt, max_tokens=8, seed=3).sequences[0]
        trainer.forward_backward([datum_from(prompt, list(sequence.tokens), list(sequence.logprobs), advantage=5.0)],
                                 loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=0.5)).result()
        weights = trainer.save_weights_for_sampler("trained").result().path
        trained = service.create_sampling_client(base_model=MODEL, model_path=weights)
        after = sample_once(trained, prompt, max_tokens=8, seed=3)
    assert base.sequences[0].tokens == sequence.tokens  # a fresh LoRA run samples as the base model
    assert after.sequences[0].logprobs != base.sequences[0].logprobs

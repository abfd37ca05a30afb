"""The twin's sampler-learner mismatch fault (``--offline-fault mismatch@SCALE``): the sampler draws
from and returns the logprobs of perturbed candidate logits, the learner computes the exact ones."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1.core.protocol import build_prompt, initial_messages
from searchr1.twin import TwinFaults, start_twin
from searchr1.twin.config import offline_fault_text, parse_offline_fault
from searchr1.twin.learning_policy import LearningPolicy, path_logprobs
from searchr1.twin.mismatch import sampler_noise
from searchr1.twin.offline_world import load_world


@pytest.fixture(scope="module")
def policy(tokenizer) -> LearningPolicy:
    return LearningPolicy(tokenizer)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return build_prompt(tokenizer, initial_messages(load_world()[0].question, max_search_calls=4))


def test_the_noise_is_a_fixed_function_of_prompt_and_candidate_and_zero_without_the_fault():
    candidates = [[1, 2, 3], [1, 2, 4], [7]]
    first = sampler_noise([5, 6], candidates, 0.5)
    assert np.array_equal(first, sampler_noise([5, 6], candidates, 0.5))  # the same rounding each time
    assert not np.array_equal(first, sampler_noise([5, 7], candidates, 0.5))  # another prompt, other noise
    assert np.array_equal(sampler_noise([5, 6], candidates[::-1], 0.5), first[::-1])  # per candidate, not position
    assert np.array_equal(sampler_noise([5, 6], candidates, 0.0), np.zeros(3))


def test_the_noise_has_the_declared_scale():
    values = np.concatenate([sampler_noise([p], [[c] for c in range(50)], 0.5) for p in range(200)])
    assert values.std() == pytest.approx(0.5, rel=0.05) and abs(values.mean()) < 0.02


def test_the_sampler_returns_the_perturbed_logprobs_and_the_learner_computes_the_exact_ones(policy, prompt):
    params = policy.initial_params()
    state = policy.state(prompt)
    noisy = policy.logits(params, state) + sampler_noise(prompt, state.tokens, 0.5)
    drawn = policy.sample(params, prompt, 8, max_tokens=4096, seed=1, temperature=1.0, logit_noise=0.5)
    for sequence in drawn:
        index = state.tokens.index(tuple(sequence.tokens))
        assert sequence.logprobs == pytest.approx(path_logprobs(state.trie, noisy, state.tokens[index]))
        inputs = np.asarray(prompt + sequence.tokens[:-1])
        targets = np.concatenate([np.full(len(prompt) - 1, -100), sequence.tokens])
        learned, _ = policy.target_logprobs(params, inputs, targets)
        exact_path = path_logprobs(state.trie, policy.logits(params, state), state.tokens[index])
        assert learned[len(prompt) - 1:] == pytest.approx(exact_path)
        assert not np.allclose(learned[len(prompt) - 1:], sequence.logprobs)  # the mismatch shows


def test_the_draws_follow_the_perturbed_distribution(policy, prompt):
    params = policy.initial_params()
    state = policy.state(prompt)
    noisy = policy.logits(params, state) + sampler_noise(prompt, state.tokens, 1.0)
    expected = np.exp(noisy - noisy.max())
    expected /= expected.sum()
    drawn = policy.sample(params, prompt, 4000, max_tokens=4096, seed=2, temperature=1.0, logit_noise=1.0)
    counts = np.bincount([state.tokens.index(tuple(s.tokens)) for s in drawn], minlength=len(expected))
    assert np.allclose(counts / len(drawn), expected, atol=0.03)


def test_the_fault_flag_reads_one_spelling_and_refuses_what_is_no_scale():
    assert parse_offline_fault("mismatch@0.5") == {"sampler_noise": 0.5}
    assert offline_fault_text(parse_offline_fault("mismatch@.50")) == "mismatch@0.5"
    assert offline_fault_text(parse_offline_fault("collapse@3")) == "collapse@3"
    assert offline_fault_text(parse_offline_fault("none")) == "none"
    for bad in ("mismatch@", "mismatch@0", "mismatch@-1", "mismatch@nan", "mismatch@11", "mismatch@x"):
        with pytest.raises(ValueError, match="SCALE"):
            parse_offline_fault(bad)
    with pytest.raises(ValueError, match="sampler_noise"):
        TwinFaults(sampler_noise=float("inf"))


def test_a_twin_that_serves_another_policy_refuses_the_fault(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="learning policy"):
        start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy", faults=TwinFaults(sampler_noise=0.5))

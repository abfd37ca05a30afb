"""Both stop-token conventions, end to end: whether the sampler returns the stop token in
``tokens`` or the stop string in ``text``, the rollout scores the same, stitches the same
prompts, and the twin accepts the resulting datums as sampled."""

from __future__ import annotations

import asyncio

import pytest
from pytrio.types import AdamParams
from twin_support import MODEL

from searchr1.core.datum import build_training_datums
from searchr1.core.advantage import assign_group_advantages
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.core.types import SearchItem, SearchResult
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.twin import StopConvention, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
SCENARIO = parse_scenario({"questions": [
    {"id": "q1", "question": "Which country is Paris in?", "answers": ["France"],
     "samples": [[CALL.format("Paris country"), "It is in France.\n\nAnswer: France"], ["Answer: Spain"],
                 ["I guess.\n\nAnswer: France"], ["No answer line here."]]},
    {"id": "q2", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"],
     "samples": [["Answer: Shakespeare"], [CALL.format("Hamlet author"), "Answer: Marlowe"],
                 ["Answer: Shakespeare"], [CALL.format("Hamlet author"), "Answer: William Shakespeare"]]},
]})
RESULTS = {"Paris country": SearchResult(True, (SearchItem("Paris", "Paris is the capital of France.", "W", "u"),)),
           "Hamlet author": SearchResult(True, (SearchItem("Hamlet", "Hamlet is a play by Shakespeare.", "W", "u"),))}
CONVENTIONS = [StopConvention(True, False), StopConvention(False, False), StopConvention(True, True),
               StopConvention(False, True)]


def rollout_and_train(tmp_path, tokenizer, convention):
    with start_twin(home=tmp_path, tokenizer=tokenizer, policy=ScriptedPolicy(SCENARIO, tokenizer),
                    convention=convention) as twin:
        service = twin.service_client(sdk_options=FAST_RETRIES)
        sampler = service.create_sampling_client(base_model=MODEL)
        config = RolloutConfig(group_size=4, sample_retry_backoff=0.0)
        trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(RESULTS)),
                                                       SCENARIO.examples, config))
        score_trajectories(trajectories)
        assign_group_advantages(trajectories)
        datums = build_training_datums(trajectories, max_tokens=config.max_trajectory_tokens)
        trainer = service.create_lora_training_client(MODEL, rank=8)
        trainer.forward_backward([d.datum for d in datums], loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=0.01)).result()
        assert twin.violations == []  # every trained token is one the twin sampled, with its logprob
    return trajectories, datums


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tokenizer):
    return {c: rollout_and_train(tmp_path_factory.mktemp("convention"), tokenizer, c) for c in CONVENTIONS}


def test_rewards_and_terminations_do_not_depend_on_the_stop_convention(outcomes):
    seen = {c: [(t.termination, t.reward, t.advantage, t.final_text, t.search_calls) for t in trajectories]
            for c, (trajectories, _) in outcomes.items()}
    reference = seen[CONVENTIONS[0]]
    assert {r for _, r, *_ in reference} == {1.0, 0.0, -0.1}  # the scenario is not trivially uniform
    assert all(value == reference for value in seen.values())


def test_the_stop_token_and_string_come_back_only_as_configured(outcomes, tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for convention, (trajectories, _) in outcomes.items():
        for turn in (turn for t in trajectories for turn in t.turns):
            assert len(turn.logprobs) == len(turn.completion_tokens)
            assert turn.stop_reason == "stop"
            assert (turn.completion_tokens[-1] == im_end) == convention.token_in_tokens
            assert turn.text.endswith("<|im_end|>") == convention.string_in_text


def test_the_datums_hold_the_same_tokens_and_train_the_final_stop_token_only_when_it_was_sampled(outcomes, tokenizer):
    """Observations start with the template's ``<|im_end|>``, so earlier turns stitch the same
    whichever convention; only a trajectory's last turn ends without it when the sampler keeps
    it back, and then the model is never trained to stop."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reference = None
    for convention, (_, datums) in outcomes.items():
        sequences = []
        for d in datums:
            full = d.datum.model_input.to_ints() + [int(d.datum.loss_fn_inputs["target_tokens"].data[-1])]
            final_is_trained = d.datum.loss_fn_inputs["advantages"].data[-1] != 0.0
            assert (full[-1] == im_end and final_is_trained) == convention.token_in_tokens
            sequences.append(full[:-1] if full[-1] == im_end else full)
        reference = reference or sequences
        assert sequences == reference

"""The production engine and the plain reference step agree: for the same sampler, search and
seeds, ``rollout_batch_async`` (concurrent, one state machine per trajectory) followed by the
trainer's scoring, advantages and datums gives exactly the trajectories and datums of
:mod:`searchr1.core.reference` (one trajectory after another), whatever the budgets."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twin_support import MODEL

from searchr1.core.advantage import assign_group_advantages
from searchr1.core.datum import build_training_datums, drop_out_of_vocab
from searchr1.core.reference import reference_datums, reference_rollout, reference_step, score_and_rank
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import TOOL_OVERFLOW_MODES, RolloutConfig, rollout_batch_async
from searchr1.core.types import SearchExample, SearchItem, SearchResult
from searchr1.core.update import UpdateConfig, apply_update
from searchr1.twin import start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.offline_world import load_world, passages_by_query
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy
from searchr1.twin.scripted_search import ScriptedSearch

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
NOTHING = SearchResult(True, ())


def item(title: str, words: int) -> SearchItem:
    return SearchItem(title, " ".join(f"{title.lower()}{i}" for i in range(words)), "Wikipedia", f"https://w/{title}")


SCRIPTED_RESULTS = {
    "alpha": SearchResult(True, (item("Alpha", 12), item("Beta", 40), item("Gamma", 80))),
    "beta": SearchResult(True, ()),
    "gamma": SearchResult(False, (), status=503, error="HTTP 503"),
    "long": SearchResult(True, (item("Long", 700), item("Short", 5))),
}
SAMPLES = [  # one list of assistant turns per sample: answers, malformed calls, searches, overflow
    [CALL.format("alpha"), "Answer: France"],
    [CALL.format("long"), CALL.format("alpha"), "Answer: Paris"],
    ["Thinking first.\n\n" + CALL.format("beta"), CALL.format("alpha"), CALL.format("long"), "Answer: France"],
    ["<tool_call>{\"name\": \"search\"}</tool_call>"],
    ["Answer: France"],
    [CALL.format("gamma"), "Answer: France"],
]
SCRIPTED = parse_scenario({"questions": [
    {"id": f"q{i}", "question": f"Question {i}?", "answers": ["France"], "data_source": "nq",
     "samples": SAMPLES[i:] + SAMPLES[:i]} for i in range(3)]})


@pytest.fixture(scope="module")
def twins(tmp_path_factory, tokenizer):
    """A sampler of the twin's scripted policy and of its learning policy (base weights)."""
    scripted = start_twin(home=tmp_path_factory.mktemp("scripted"), tokenizer=tokenizer, policy="toy")
    scripted.policy = ScriptedPolicy(SCRIPTED, tokenizer)
    learning = start_twin(home=tmp_path_factory.mktemp("learning"), tokenizer=tokenizer, policy="learning")
    samplers = {name: twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(base_model=MODEL)
                for name, twin in (("scripted", scripted), ("learning", learning))}
    yield samplers, learning
    scripted.close()
    learning.close()


def world():
    questions = [q for q in load_world() if q.split == "train"]
    examples = [SearchExample(q.id, q.question, q.answers, q.data_source) for q in questions]
    results = {query: SearchResult(True, (SearchItem(hop.title, hop.text, "Wikipedia"),))
               for query, hop in passages_by_query(questions).items()}
    return examples, results


configs = st.builds(
    RolloutConfig,
    group_size=st.integers(2, 6),
    max_search_calls=st.integers(0, 3),
    max_assistant_turns=st.integers(1, 4),
    max_trajectory_tokens=st.sampled_from([500, 530, 600, 700, 900, 1200, 2000, 8192]),
    max_assistant_tokens=st.sampled_from([8, 24, 64, 1024]),
    max_tool_response_tokens=st.sampled_from([16, 60, 200, 1024]),
    tool_overflow=st.sampled_from(TOOL_OVERFLOW_MODES),
    seed=st.integers(0, 2**20),
    sample_retry_backoff=st.just(0.0),
)


def production(sampler, tokenizer, results, examples, config, step):
    trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, ScriptedSearch(results, default=NOTHING),
                                                   examples, config, step=step))
    score_trajectories(trajectories)
    assign_group_advantages(trajectories)
    datums, _ = drop_out_of_vocab(build_training_datums(trajectories, max_tokens=config.max_trajectory_tokens),
                                  len(tokenizer))
    return trajectories, datums


def datum_values(datum):
    inputs = datum.loss_fn_inputs
    return (datum.model_input.to_ints(), *(list(inputs[k].data) for k in ("target_tokens", "logprobs", "advantages")))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(["scripted", "learning"]), config=configs, step=st.integers(0, 50), data=st.data())
def test_the_engine_produces_the_reference_trajectories_and_datums(twins, tokenizer, policy, config, step, data):
    """Invariant: engine(sampler, search, seeds) == reference(sampler, search, seeds), trajectory for
    trajectory (every token, logprob, message, search, termination, score, advantage) and datum for
    datum, for the scripted and the learning policy under any budgets and overflow mode."""
    samplers, _ = twins
    if policy == "scripted":
        examples, results = SCRIPTED.examples, SCRIPTED_RESULTS
        config = RolloutConfig(**{**config.__dict__, "group_size": min(config.group_size, len(SAMPLES))})
    else:
        examples, results = world()
        start = data.draw(st.integers(0, len(examples) - 3))
        examples = examples[start:start + 3]
    trajectories, datums = production(samplers[policy], tokenizer, results, examples, config, step)
    expected = reference_rollout(samplers[policy], tokenizer, lambda q: results.get(q, NOTHING), examples, config,
                                 step=step)
    score_and_rank(expected)
    assert trajectories == expected
    assert [datum_values(d.datum) for d in datums] == [datum_values(d) for d in
                                                         reference_datums(expected, len(tokenizer))]


def test_the_reference_step_and_the_trainer_send_the_same_update(twins, tokenizer):
    """Invariant: the reference step's forward_backward sees the datums the production update sends,
    so two training clients with the same seed report the same loss."""
    samplers, learning = twins
    examples, results = world()
    config = RolloutConfig(group_size=4, seed=3)
    service = learning.service_client(sdk_options=FAST_RETRIES)
    ours, theirs = (service.create_lora_training_client(base_model=MODEL, rank=8, seed=5) for _ in range(2))
    _, datums = production(samplers["learning"], tokenizer, results, examples[:4], config, 0)
    assert datums, "the batch carries a signal"
    update = asyncio.run(apply_update(ours, [datums], UpdateConfig(learning_rate=0.2, beta1=0.9, beta2=0.95)))
    _, sent, loss = reference_step(samplers["learning"], theirs, tokenizer, lambda q: results.get(q, NOTHING),
                                   examples[:4], config, step=0, learning_rate=0.2)
    assert len(sent) == len(datums) and loss == update.outputs[0]

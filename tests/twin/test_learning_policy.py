"""The twin's learning policy: exact token logprobs, exact gradients, and a closed loop that
shows it learns from the project's own RL update (and does not from broken signals).

The closed loop here is the reference step (:mod:`searchr1.core.reference`: sample, parse,
search, stitch, score, advantage, datum) with the policy sampling in process, then
``loss_and_grad`` plus AdamW; the reference is held equal to the production engine elsewhere.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.types import AdamParams

from searchr1.training.config import TrainConfig
from searchr1.core.settings import offline_defaults
from searchr1.core.types import SearchExample, SearchItem, SearchResult, Trajectory, Turn
from searchr1.core.datum import build_datums
from searchr1.offline import QUESTIONS
from searchr1.core.protocol import assistant_message, build_prompt, initial_messages, parse_assistant, tool_message
from searchr1.core.reward import score_answer, score_trajectories
from searchr1.core.tools import OPEN_PAGE, SEARCH, ToolCall, ToolSpec, parse_tool_calls, shown_call
from searchr1.core.types import FORMAT_PENALTY
from searchr1.core.reference import reference_datums, reference_rewards_and_advantages, reference_rollout
from searchr1.core.rollout import RolloutConfig, add_observation, make_request, record_turn
from searchr1.core.observation.text import format_observation
from searchr1.twin.optimizer import AdamState, adam_step
from remembering_tokenizer import RememberingTokenizer
from searchr1.twin.learning_policy import (
    BASE_LOGITS,
    ENVIRONMENT_LOGPROB,
    KINDS,
    OFF_TRIE_LOGPROB,
    PHASES,
    VALID_KINDS,
    LearningPolicy,
    PromptFormatError,
    TrieNode,
    UnknownQuestionError,
    candidate_text,
    path_logprobs,
)
from searchr1.twin.offline_world import (WorldError, WorldQuestion, load_world, load_worlds, parse_world,
                                        passages_by_query)
from searchr1.twin.policy import REDUCTIONS, PolicySample, TwinPolicy, totals_of

# The defaults of `train --offline` with the learning policy, taken from their declarations.
DEFAULT_STEPS = offline_defaults(TrainConfig, "learning")["max_steps"]
DEFAULT_LEARNING_RATE = offline_defaults(TrainConfig, "learning")["learning_rate"]
DEFAULT_QUESTIONS_PER_BATCH = next(f.default for f in fields(TrainConfig) if f.name == "questions_per_batch")
DEFAULT_GROUP_SIZE = RolloutConfig().group_size
DEFAULT_SEED = next(f.default for f in fields(TrainConfig) if f.name == "seed")


@pytest.fixture(scope="module")
def policy(tokenizer) -> LearningPolicy:
    return LearningPolicy(tokenizer)


@pytest.fixture(scope="module")
def world() -> tuple[WorldQuestion, ...]:
    return load_world()


def by_id(world: Sequence[WorldQuestion], question_id: str) -> WorldQuestion:
    return next(q for q in world if q.id == question_id)


def search_result(question: WorldQuestion, hop: int) -> SearchResult:
    found = question.hops[hop]
    return SearchResult(ok=True, items=(SearchItem(found.title, found.text, source="Wikipedia"),))


def prompt_with_hops(tokenizer, question: WorldQuestion, found: int, budget: int | None = 4) -> list[int]:
    """A full render of the conversation in which the first ``found`` hops were searched."""
    messages = initial_messages(question.question, max_search_calls=budget)
    for hop in range(found):
        messages.append(assistant_message(candidate_text(question, hop, "search_next")))
        messages.append(tool_message(f"call-{hop}", format_observation(search_result(question, hop))))
    return build_prompt(tokenizer, messages)


def random_params(seed: int, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-scale, scale, size=(len(PHASES), len(KINDS)))


def all_states(policy, tokenizer, world) -> list[list[int]]:
    """One prompt per (question, hops found), for a spread of one- and two-hop questions."""
    chosen = [by_id(world, i) for i in ("off-train-01", "off-train-02", "off-dev-07", "off-dev-12")]
    return [prompt_with_hops(tokenizer, q, found) for q in chosen for found in range(len(q.hops) + 1)]


@pytest.fixture(scope="module")
def state_prompts(policy, tokenizer, world) -> list[list[int]]:
    return all_states(policy, tokenizer, world)


# --------------------------------------------------------------------------- the world


def test_learning_policy_has_the_twin_policy_signatures(policy):
    for name in ("initial_params", "sample", "loss_and_grad"):
        expected = inspect.signature(getattr(TwinPolicy, name)).parameters
        actual = list(inspect.signature(getattr(LearningPolicy, name)).parameters.values())
        assert [(p.name, p.kind) for p in actual[:len(expected)]] == [(p.name, p.kind) for p in expected.values()]
        extra = actual[len(expected):]  # its own keywords (the mismatch fault's logit noise), each with a default
        assert all(p.kind == p.KEYWORD_ONLY and p.default is not p.empty for p in extra), extra
    assert isinstance(policy.kind, str) and policy.kind
    assert policy.initial_params().shape == (len(PHASES), len(KINDS))
    assert not policy.initial_params().any()


def test_offline_world_reads_every_question_with_its_hops(world):
    source = json.loads(QUESTIONS.read_text("utf-8"))
    assert [q.id for q in world] == [i["id"] for i in source["train"]] + [i["id"] for i in source["dev"]]
    assert {q.split for q in world} == {"train", "dev"}
    assert all(1 <= len(q.hops) <= 2 for q in world)
    passages = passages_by_query(world)
    assert all(passages[hop.query] == hop for q in world for hop in q.hops)


def test_a_malformed_world_names_the_question_and_the_field():
    with pytest.raises(WorldError, match=r"train\[0\] \(q1\): missing field 'wrong'"):
        hop = {"query": "q", "title": "t", "text": "x"}
        parse_world({"train": [{"id": "q1", "question": "x?", "answers": ["a"], "hops": [hop]}], "dev": []},
                    where="w.json")
    with pytest.raises(WorldError, match=r"q2 repeats the question of q1"):
        item = {"question": "Same?", "answers": ["a"], "wrong": "b",
                "hops": [{"query": "q", "title": "t", "text": "x"}]}
        parse_world({"train": [{**item, "id": "q1"}], "dev": [{**item, "id": "q2"}]}, where="w.json")


def page_prompt(tokenizer, question: WorldQuestion, shown: Sequence[str], tools: Sequence[ToolSpec]) -> list[int]:
    """The conversation in which each of ``shown`` came back from one search of the question's hop."""
    hop = question.hops[0]
    messages = initial_messages(question.question, max_search_calls=4)
    for text in shown:
        messages.append(assistant_message(candidate_text(question, 0, "search_next")))
        messages.append(tool_message("call", format_observation(
            SearchResult(ok=True, items=(SearchItem(hop.title, text, source="local"),)))))
    return build_prompt(tokenizer, messages, tools=[tool.schema() for tool in tools])


def test_a_page_hop_is_opened_once_search_showed_its_lead_and_only_where_open_page_is_offered(policy, tokenizer):
    question = next(q for q in load_worlds() if q.id == "page-train-01")
    hop = question.hops[0]
    assert hop.is_page and hop.text in hop.body and hop.text not in hop.lead

    def next_step(shown, tools):
        state = policy.state(page_prompt(tokenizer, question, shown, tools))
        return state, state.texts[state.kinds.index(KINDS.index("search_next"))] if state.found < 1 else None

    state, step = next_step([], (SEARCH, OPEN_PAGE))
    assert not state.open_next and f"<parameter=query>\n{hop.query}\n" in step  # first, search
    state, step = next_step([hop.lead], (SEARCH, OPEN_PAGE))
    assert state.open_next and f"<function=open_page>\n<parameter=page>\n{hop.title}\n" in step
    _, (call,) = parse_tool_calls(step, (SEARCH, OPEN_PAGE))
    assert call == ToolCall("open_page", {"page": hop.title})  # what the rollout's parser reads
    state, step = next_step([hop.lead], (SEARCH,))
    assert not state.open_next and f"<parameter=query>\n{hop.query}\n" in step  # no page to open: search again
    state, _ = next_step([hop.lead, " ".join(hop.body)], (SEARCH, OPEN_PAGE))
    assert state.found == 1 and PHASES[state.phase] == "complete"


def test_a_page_hop_whose_evidence_is_not_on_its_page_is_named():
    page = {"query": "q", "title": "T", "text": "the evidence", "lead": "the lead", "body": ["another passage"]}
    source = {"train": [{"id": "p1", "question": "Q?", "answers": ["A"], "wrong": "B", "hops": [page]}], "dev": []}
    with pytest.raises(WorldError, match=r"p1\): hops\[0\]: field 'body' must list"):
        parse_world(source, where="pages.json")


def test_candidates_behave_as_their_kind_says_under_the_real_parser_and_reward(policy, tokenizer, world):
    """The environment, not the policy, decides what pays: only the answer after every hop
    is right; searches parse as tool calls with the hop query; the rest fail the format."""
    for question in world:
        for found in range(len(question.hops) + 1):
            state = policy.state(prompt_with_hops(tokenizer, question, found))
            assert state.found == found
            for kind_index, text in zip(state.kinds, state.texts):
                kind, parsed = KINDS[kind_index], parse_assistant(text)
                if kind == "search_next":
                    assert (parsed.kind, parsed.query) == ("tool", question.hops[found].query)
                elif kind == "repeat_search":
                    assert (parsed.kind, parsed.query) == ("tool", question.hops[found - 1].query)
                elif kind == "json_call":
                    assert parsed.kind == "invalid"
                else:
                    assert parsed.kind == "answer"
                    result = score_answer(text, question.answers)
                    if kind == "no_answer":
                        assert result.reward == FORMAT_PENALTY
                    else:
                        assert result.exact_match == (found == len(question.hops))


def test_base_model_is_poor_but_gives_every_behaviour_a_real_chance(policy, state_prompts):
    base = policy.initial_params()
    for prompt in state_prompts:
        state = policy.state(prompt)
        probabilities = policy.kind_probabilities(base, prompt)
        assert min(probabilities.values()) >= 0.1
        if state.phase < 2:  # before all evidence is in, the base model prefers to answer
            assert max(probabilities, key=probabilities.get) == "answer"
    assert VALID_KINDS.sum() == 13 and BASE_LOGITS.shape == VALID_KINDS.shape


def test_an_unknown_question_or_a_prompt_without_the_header_is_named(policy, tokenizer):
    prompt = build_prompt(tokenizer, initial_messages("Who built the Colossus of Rhodes?"))
    with pytest.raises(UnknownQuestionError, match="Who built the Colossus of Rhodes"):
        policy.sample(policy.initial_params(), prompt, 1, max_tokens=64, seed=0, temperature=1.0)
    with pytest.raises(PromptFormatError, match="generation header"):
        policy.sample(policy.initial_params(), prompt[:-1], 1, max_tokens=64, seed=0, temperature=1.0)
    known = build_prompt(tokenizer, initial_messages("who painted the mona lisa?"))
    with pytest.raises(ValueError, match=r"params must have shape \(3, 5\)"):
        policy.sample(np.zeros(3), known, 1, max_tokens=64, seed=0, temperature=1.0)


# --------------------------------------------------------------------------- exact logprobs


def log_softmax(values: np.ndarray) -> np.ndarray:
    shifted = values - values.max()
    return shifted - math.log(np.exp(shifted).sum())


def nodes_with_paths(state) -> list[tuple[TrieNode, list[int]]]:
    """Every inner trie node with the token path that leads to it."""
    out, stack = [], [(state.trie, [])]
    while stack:
        node, path = stack.pop()
        if node.children:
            out.append((node, path))
        stack.extend((child, path + [token]) for token, child in node.children.items())
    return out


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_trie_node_distribution_sums_to_one_for_the_sampler_and_the_trainer(policy, state_prompts, seed):
    """At every node, the next-token probabilities over its children add up to one, both as
    the sampler reports them and as ``loss_and_grad`` computes them from a datum."""
    params = random_params(seed)
    for prompt in state_prompts[:4]:
        state = policy.state(prompt)
        logits = policy.logits(params, state)
        along: dict[tuple[int, ...], list[float]] = {}  # a member's path logprobs, each computed once
        for node, path in nodes_with_paths(state):
            assert sorted(m for child in node.children.values() for m in child.members) == sorted(node.members)
            depth = len(path)
            sampler_side, trainer_side = 0.0, 0.0
            for token, child in node.children.items():
                member_path = state.tokens[child.members[0]]
                if tuple(member_path) not in along:
                    along[tuple(member_path)] = path_logprobs(state.trie, logits, member_path)
                sampler_side += math.exp(along[tuple(member_path)][depth])
                inputs = np.array(prompt + path, dtype=np.int64)
                targets = np.full(len(inputs), -100, dtype=np.int64)
                targets[-1] = token
                logp, _ = policy.target_logprobs(params, inputs, targets)
                trainer_side += math.exp(logp[-1])
            assert math.isclose(sampler_side, 1.0, abs_tol=1e-12)
            assert math.isclose(trainer_side, 1.0, abs_tol=1e-12)


# --------------------------------------------------------------------------- sampling


def sample_prompt_cases(state_prompts) -> list[tuple[list[int], np.ndarray, float]]:
    """(prompt, params, temperature) cases: the base model, trained-looking params, hot and cold."""
    return [
        (state_prompts[0], np.zeros((len(PHASES), len(KINDS))), 1.0),
        (state_prompts[3], random_params(7, scale=1.5), 1.0),
        (state_prompts[4], random_params(8, scale=1.5), 0.6),
        (state_prompts[6], random_params(9, scale=1.0), 2.0),
    ]


def test_sampling_frequencies_match_the_probabilities_the_sampler_returns(policy, state_prompts):
    draws = 4000
    for prompt, params, temperature in sample_prompt_cases(state_prompts):
        state = policy.state(prompt)
        sequences = policy.sample(params, prompt, draws, max_tokens=1024, seed=12345, temperature=temperature)
        counts = Counter(tuple(s.tokens) for s in sequences)
        returned: dict[tuple[int, ...], float] = {}
        for s in sequences:
            assert s.stopped and tuple(s.tokens) in state.tokens
            probability = math.exp(sum(s.logprobs))
            assert math.isclose(returned.setdefault(tuple(s.tokens), probability), probability)
        for tokens, probability in returned.items():
            spread = 5.0 * math.sqrt(probability * (1.0 - probability) / draws) + 1.0 / draws
            assert abs(counts[tokens] / draws - probability) <= spread, (state.texts, tokens)
        assert 1.0 - sum(returned.values()) < 10.0 / draws  # nothing likely went unseen


def test_the_same_seed_and_prompt_give_the_same_draws_and_another_seed_does_not(policy, state_prompts):
    prompt, params = state_prompts[3], random_params(3, scale=0.5)
    first = policy.sample(params, prompt, 32, max_tokens=1024, seed=5, temperature=1.0)
    again = policy.sample(params, prompt, 32, max_tokens=1024, seed=5, temperature=1.0)
    other = policy.sample(params, prompt, 32, max_tokens=1024, seed=6, temperature=1.0)
    assert first == again
    assert [s.tokens for s in first] != [s.tokens for s in other]


def test_temperature_zero_returns_the_argmax_candidate_with_certainty(policy, state_prompts):
    for prompt, params, _ in sample_prompt_cases(state_prompts):
        state = policy.state(prompt)
        best = state.tokens[int(np.argmax(policy.logits(params, state)))]
        sequences = policy.sample(params, prompt, 3, max_tokens=1024, seed=None, temperature=0.0)
        assert all(tuple(s.tokens) == best and s.logprobs == [0.0] * len(best) and s.stopped for s in sequences)


@settings(max_examples=30, deadline=None)
@given(max_tokens=st.integers(1, 60), seed=st.integers(0, 2**31 - 1))
def test_max_tokens_cuts_the_drawn_candidate_and_keeps_its_logprobs(policy, state_prompts, max_tokens, seed):
    prompt, params = state_prompts[4], random_params(seed % 1000, scale=1.0)
    (full,) = policy.sample(params, prompt, 1, max_tokens=1024, seed=seed, temperature=1.0)
    (cut,) = policy.sample(params, prompt, 1, max_tokens=max_tokens, seed=seed, temperature=1.0)
    assert cut.tokens == full.tokens[:max_tokens] and cut.logprobs == full.logprobs[:max_tokens]
    assert cut.stopped == (len(full.tokens) <= max_tokens)


# --------------------------------------------------------------------------- loss and gradient

LOSSES = ("importance_sampling", "cross_entropy")
ROLLOUT_PARAMS_SEED = 11


@pytest.fixture(scope="module")
def rolled_out(policy, loop_tokenizer, world) -> tuple[np.ndarray, list[Trajectory]]:
    """Trajectories sampled by the policy itself (one- and two-hop questions, mixed outcomes)."""
    params = random_params(ROLLOUT_PARAMS_SEED, scale=1.0)
    questions = [by_id(world, i) for i in ("off-train-01", "off-train-02", "off-train-05", "off-train-03")]
    config = RolloutConfig(group_size=4, seed=3)
    return params, roll_out(policy, params, loop_tokenizer, [example_of(q) for q in questions], config, 0, world)


@pytest.fixture(scope="module")
def datum_samples(rolled_out) -> list[PolicySample]:
    """One sample per trajectory, every trajectory given a non-zero advantage."""
    samples = []
    for index, trajectory in enumerate(rolled_out[1]):
        trajectory_copy = copy.deepcopy(trajectory)
        trajectory_copy.credit((0.5, -0.25, 1.0)[index % 3])
        samples.append(PolicySample.from_datum(build_datums(trajectory_copy)[0].datum))
    return samples


def test_the_rollouts_behind_the_loss_tests_cover_several_kinds_and_turns(rolled_out):
    _, trajectories = rolled_out
    assert {t.termination for t in trajectories} >= {"answer", "invalid"}
    assert max(len(t.turns) for t in trajectories) >= 3
    assert len({t.reward for t in trajectories}) >= 2


def test_trainer_logprobs_on_the_policys_own_datums_equal_the_sampler_logprobs(policy, rolled_out, datum_samples):
    """On policy, ``loss_and_grad`` sees exactly the logprobs the sampler returned at every
    generated token, and the fixed environment logprob everywhere else."""
    params, _ = rolled_out
    for sample in datum_samples:
        logp, _ = policy.target_logprobs(params, sample.inputs, sample.targets)
        generated = sample.advantages != 0.0
        np.testing.assert_allclose(logp[generated], sample.old_logprobs[generated], atol=1e-6)
        assert np.all(logp[~generated] == ENVIRONMENT_LOGPROB)


def perturbed(samples: Sequence[PolicySample], rng: np.random.Generator) -> list[PolicySample]:
    """Random advantages, CE weights and stale old logprobs at every position."""
    out = []
    for s in samples:
        n = len(s.targets)
        out.append(PolicySample(s.inputs, s.targets, s.old_logprobs + rng.normal(0.0, 0.3, n),
                                rng.normal(0.0, 1.0, n), rng.uniform(0.2, 2.0, n)))
    return out


@settings(max_examples=16, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), loss_fn=st.sampled_from(LOSSES), reduction=st.sampled_from(REDUCTIONS))
def test_gradient_equals_finite_differences_for_every_loss_and_reduction(
        policy, datum_samples, seed, loss_fn, reduction):
    rng = np.random.default_rng(seed)
    params = rng.uniform(-2.0, 2.0, size=(len(PHASES), len(KINDS)))
    samples = perturbed(datum_samples[::3], rng)
    totals = totals_of(samples)

    def loss_at(theta: np.ndarray) -> float:
        return policy.loss_and_grad(theta, samples, loss_fn=loss_fn, reduction=reduction, totals=totals).loss

    grad = policy.loss_and_grad(params, samples, loss_fn=loss_fn, reduction=reduction, totals=totals).grad
    step = 1e-6
    numeric = np.zeros_like(params)
    for cell in zip(*np.nonzero(VALID_KINDS)):
        bump = np.zeros_like(params)
        bump[cell] = step
        numeric[cell] = (loss_at(params + bump) - loss_at(params - bump)) / (2 * step)
    assert np.all(grad[~VALID_KINDS] == 0.0)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8 * (1.0 + np.abs(numeric).max()))
    assert np.abs(grad).max() > 0.0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), loss_fn=st.sampled_from(LOSSES), reduction=st.sampled_from(REDUCTIONS),
       cuts=st.lists(st.integers(1, 15), max_size=4))
def test_result_does_not_depend_on_how_datums_are_split_into_chunks(
        policy, datum_samples, seed, loss_fn, reduction, cuts):
    rng = np.random.default_rng(seed)
    params = rng.uniform(-2.0, 2.0, size=(len(PHASES), len(KINDS)))
    samples = perturbed(datum_samples, rng)
    totals = totals_of(samples)
    whole = policy.loss_and_grad(params, samples, loss_fn=loss_fn, reduction=reduction, totals=totals)
    bounds = [0, *sorted({c for c in cuts if c < len(samples)}), len(samples)]
    parts = [policy.loss_and_grad(params, samples[a:b], loss_fn=loss_fn, reduction=reduction, totals=totals)
             for a, b in itertools.pairwise(bounds)]
    assert math.isclose(sum(p.loss for p in parts), whole.loss, rel_tol=1e-10, abs_tol=1e-12)
    assert math.isclose(sum(p.loss_sum for p in parts), whole.loss_sum, rel_tol=1e-10, abs_tol=1e-12)
    assert sum(p.token_count for p in parts) == whole.token_count == totals.active_tokens
    np.testing.assert_allclose(sum(p.grad for p in parts), whole.grad, rtol=1e-10, atol=1e-15)
    for mine, theirs in zip([lp for p in parts for lp in p.logprobs], whole.logprobs):
        assert np.array_equal(mine, theirs)


def scripted_trajectory(policy, tokenizer, question: WorldQuestion, kinds: Sequence[str], params: np.ndarray,
                        *, include_stop: bool) -> Trajectory:
    """A trajectory that takes the given candidate kinds, through the engine's transitions,
    with the sampler returning or omitting the stop token."""
    config = RolloutConfig(group_size=1)
    trajectory = Trajectory(example_of(question), 0, 0, initial_messages(question.question, max_search_calls=4))
    for kind in kinds:
        request = make_request(tokenizer, [trajectory], 0, config)
        assert request is not None
        state = policy.state(request.prompt_tokens)
        index = [KINDS[k] for k in state.kinds].index(kind)
        tokens = list(state.tokens[index])
        logprobs = path_logprobs(state.trie, policy.logits(params, state), tokens)
        if not include_stop:
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        turn = Turn(request.prompt_tokens, tokens, logprobs, state.texts[index], "stop")
        pending = record_turn(trajectory, turn, tokenizer, config)
        if pending is not None:
            hop = passages_by_query([question])[shown_call(pending.calls[0])]
            found = SearchResult(ok=True, items=(SearchItem(hop.title, hop.text, source="Wikipedia"),))
            add_observation(pending, [found], tokenizer, config)
    score_trajectories([trajectory])
    trajectory.credit(1.0)
    return trajectory


def test_a_datum_whose_sampler_omitted_the_stop_token_gets_the_same_logprobs_on_the_tokens_it_has(
        policy, tokenizer, world):
    question, params = by_id(world, "off-train-02"), random_params(5, scale=1.0)
    kinds = ("search_next", "repeat_search", "search_next", "answer")
    with_stop = PolicySample.from_datum(build_datums(scripted_trajectory(
        policy, tokenizer, question, kinds, params, include_stop=True))[0].datum)
    without = PolicySample.from_datum(build_datums(scripted_trajectory(
        policy, tokenizer, question, kinds, params, include_stop=False))[0].datum)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the environment appended the three inner stop tokens, the last one is simply absent
    assert np.array_equal(without.targets, with_stop.targets[:-1]) and with_stop.targets[-1] == stop
    after_completion = np.concatenate([[False], without.advantages[:-1] != 0.0])
    appended = np.flatnonzero((without.targets == stop) & (without.advantages == 0.0) & after_completion)
    assert len(appended) == 3 and np.all(with_stop.advantages[appended] != 0.0)
    full, _ = policy.target_logprobs(params, with_stop.inputs, with_stop.targets)
    cut, _ = policy.target_logprobs(params, without.inputs, without.targets)
    assert np.array_equal(cut, full[:-1])
    np.testing.assert_allclose(full[with_stop.advantages != 0.0], with_stop.old_logprobs[with_stop.advantages != 0.0],
                               atol=1e-6)


def test_prompt_and_observation_tokens_get_no_gradient_even_when_given_the_advantage(policy, rolled_out, datum_samples):
    params, _ = rolled_out
    # the datum's advantage copied onto every position: prompt, observations, closings
    leaked = [PolicySample(s.inputs, s.targets, s.old_logprobs,
                           np.full(len(s.targets), s.advantages[s.advantages != 0][0]), s.weights)
              for s in datum_samples]
    for reduction in REDUCTIONS:
        proper = policy.loss_and_grad(params, datum_samples, loss_fn="importance_sampling", reduction=reduction,
                                      totals=totals_of(datum_samples))
        control = policy.loss_and_grad(params, leaked, loss_fn="importance_sampling", reduction=reduction,
                                       totals=totals_of(datum_samples))
        assert np.array_equal(proper.grad, control.grad)
        assert control.loss != proper.loss  # the constant terms are there, they just carry no gradient


def test_a_generated_token_off_the_trie_gets_the_fixed_low_logprob_and_no_gradient(policy, rolled_out, datum_samples):
    params, _ = rolled_out
    sample = datum_samples[0]
    generated = np.flatnonzero(sample.advantages != 0.0)
    first = int(generated[0])
    segment, positions = [first], set(generated.tolist())
    while segment[-1] + 1 in positions:  # the first completion, up to its stop token
        segment.append(segment[-1] + 1)
    foreign = 11  # ",": no candidate turn starts with it
    targets, inputs = sample.targets.copy(), sample.inputs.copy()
    targets[first], inputs[first + 1] = foreign, foreign
    tampered = PolicySample(inputs, targets, sample.old_logprobs, sample.advantages, sample.weights)
    logp, slopes = policy.target_logprobs(params, tampered.inputs, tampered.targets)
    assert np.all(logp[segment] == OFF_TRIE_LOGPROB)
    assert not any(position in segment for position, _, _ in slopes)
    original, _ = policy.target_logprobs(params, sample.inputs, sample.targets)
    later = slice(segment[-1] + 1, None)
    assert np.array_equal(logp[later], original[later])


# --------------------------------------------------------------------------- the closed loop


def example_of(question: WorldQuestion) -> SearchExample:
    return SearchExample(question.id, question.question, question.answers, question.data_source)


class InProcessSampler:
    """``SamplingClient.sample`` as the reference step calls it, answered in process by the learning
    policy at ``params`` (no PyTRIO client in between)."""

    def __init__(self, policy: LearningPolicy, params: np.ndarray) -> None:
        self.policy, self.params = policy, params

    def sample(self, *, prompt, num_samples, sampling_params, return_text=True):
        drawn = self.policy.sample(self.params, prompt.to_ints(), num_samples, max_tokens=sampling_params.max_tokens,
                                   seed=sampling_params.seed, temperature=sampling_params.temperature)
        sequences = [SimpleNamespace(tokens=list(s.tokens), logprobs=list(s.logprobs), text=None,
                                     stop_reason="stop" if s.stopped else "length") for s in drawn]
        return SimpleNamespace(result=lambda: SimpleNamespace(sequences=sequences))


def world_search(world: Sequence[WorldQuestion]):
    """The reference's tools: search answers each hop query (stripped) with its passage (an unknown
    query is a bug of the policy)."""
    passages = passages_by_query(world)

    def search(arguments):
        passage = passages[str(arguments["query"]).strip()]
        return SearchResult(ok=True, items=(SearchItem(passage.title, passage.text, source="Wikipedia"),))
    return {"search": search}


def roll_out(policy: LearningPolicy, params: np.ndarray, tokenizer, examples: Sequence[SearchExample],
             config: RolloutConfig, step: int, world: Sequence[WorldQuestion]) -> list[Trajectory]:
    """One batch through the reference step (:mod:`searchr1.core.reference`), scored, with group
    advantages."""
    trajectories = reference_rollout(InProcessSampler(policy, params), tokenizer, world_search(world), examples,
                                     config, step=step)
    reference_rewards_and_advantages(trajectories)
    return trajectories


@pytest.fixture(scope="module")
def loop_tokenizer(tokenizer) -> RememberingTokenizer:
    """The tokenizer the closed-loop runs of this module share (one memory for all of them)."""
    return RememberingTokenizer(tokenizer)


def test_the_remembering_tokenizer_answers_as_the_tokenizer_does(tokenizer, world):
    remembering = RememberingTokenizer(tokenizer)
    messages = initial_messages(world[0].question, max_search_calls=4)
    for _ in range(2):  # the first call asks the tokenizer, the second is remembered
        for options in ({"tokenize": True, "add_generation_prompt": True, "enable_thinking": False},
                        {"tokenize": False, "add_generation_prompt": False, "enable_thinking": False}):
            assert remembering.apply_chat_template(messages, return_dict=False, **options) == \
                tokenizer.apply_chat_template(messages, return_dict=False, **options)
        ids = remembering.encode(world[0].question, add_special_tokens=False)
        assert ids == tokenizer.encode(world[0].question, add_special_tokens=False)
        ids.append(0)  # a caller changing its copy changes nothing remembered
        assert remembering.decode(ids[:-1]) == tokenizer.decode(ids[:-1]) == \
            tokenizer.decode(tokenizer.encode(world[0].question, add_special_tokens=False))
    assert len(remembering) == len(tokenizer) and remembering.eos_token == tokenizer.eos_token


Tamper = Callable[[list[Trajectory], np.random.Generator], None]


@dataclass(frozen=True)
class LearningRun:
    params: np.ndarray
    rewards: list[float]  # mean reward of each step's batch, before its update
    losses: list[float]

    @property
    def rise(self) -> float:
        return float(np.mean(self.rewards[-5:]) - np.mean(self.rewards[:5]))


def train(policy: LearningPolicy, tokenizer, world: Sequence[WorldQuestion], *, steps: int = DEFAULT_STEPS,
          learning_rate: float = DEFAULT_LEARNING_RATE, questions_per_batch: int = DEFAULT_QUESTIONS_PER_BATCH,
          group_size: int = DEFAULT_GROUP_SIZE, seed: int = DEFAULT_SEED, tamper: Tamper | None = None) -> LearningRun:
    """The training loop of ``train --offline`` in miniature: batches walk the train split in
    order, one importance-sampling ``loss_and_grad`` per step reduced per token over the
    whole call, one AdamW step with the trainer's betas."""
    examples = [example_of(q) for q in world if q.split == "train"]
    config = RolloutConfig(group_size=group_size, seed=seed)
    adam = AdamParams(learning_rate=learning_rate, beta1=0.9, beta2=0.95)
    params, state = policy.initial_params(), AdamState.zeros_like(policy.initial_params())
    rng = np.random.default_rng(seed)
    rewards, losses = [], []
    for step in range(steps):
        batch = [examples[(step * questions_per_batch + i) % len(examples)] for i in range(questions_per_batch)]
        trajectories = roll_out(policy, params, tokenizer, batch, config, step, world)
        rewards.append(float(np.mean([t.reward for t in trajectories])))
        if tamper is not None:
            tamper(trajectories, rng)
        samples = [PolicySample.from_datum(d) for d in reference_datums(trajectories, len(tokenizer))]
        if not samples:
            losses.append(0.0)
            continue
        result = policy.loss_and_grad(params, samples, loss_fn="importance_sampling", reduction="per_token",
                                      totals=totals_of(samples))
        losses.append(result.loss)
        update = adam_step(params, result.grad, state, adam)
        params, state = update.params, update.state
    return LearningRun(params, rewards, losses)


def dev_exact_match(policy, tokenizer, world, params, *, temperature: float, group_size: int) -> float:
    """Micro EM over the dev questions (``group_size`` samples each)."""
    dev = [example_of(q) for q in world if q.split == "dev"]
    config = RolloutConfig(group_size=group_size, seed=7, temperature=temperature)
    trajectories = roll_out(policy, params, tokenizer, dev, config, 0, world)
    return float(np.mean([t.score.exact_match for t in trajectories]))


def negate_advantages(trajectories: list[Trajectory], rng: np.random.Generator) -> None:
    for trajectory in trajectories:
        trajectory.credit(-trajectory.advantage)


def shuffle_advantages_across_groups(trajectories: list[Trajectory], rng: np.random.Generator) -> None:
    """Every trained trajectory gets the advantage of a random trajectory of the batch."""
    trained = [t for t in trajectories if t.excluded is None]
    for trajectory, advantage in zip(trained, rng.permutation([t.advantage for t in trained])):
        trajectory.credit(float(advantage))


@pytest.fixture(scope="module")
def default_run(policy, loop_tokenizer, world) -> LearningRun:
    return train(policy, loop_tokenizer, world)


def test_default_offline_settings_raise_the_mean_reward_by_at_least_0_3(default_run):
    assert len(default_run.rewards) == DEFAULT_STEPS
    assert default_run.rise >= 0.3, default_run.rewards
    assert all(math.isfinite(loss) for loss in default_run.losses) and any(loss != 0.0 for loss in default_run.losses)


def test_learned_policy_beats_the_base_policy_on_dev_by_20_points_greedy_and_sampled(
        policy, loop_tokenizer, world, default_run):
    tokenizer = loop_tokenizer
    base = policy.initial_params()
    for temperature, group_size in ((0.0, 1), (1.0, 8)):
        before = dev_exact_match(policy, tokenizer, world, base, temperature=temperature, group_size=group_size)
        after = dev_exact_match(policy, tokenizer, world, default_run.params, temperature=temperature,
                                group_size=group_size)
        assert after - before >= 0.20, (temperature, before, after)


def test_negated_advantages_do_not_raise_the_reward(policy, loop_tokenizer, world):
    run = train(policy, loop_tokenizer, world, tamper=negate_advantages)
    assert run.rise < 0.1, run.rewards


def test_advantages_shuffled_across_groups_do_not_raise_the_reward(policy, loop_tokenizer, world):
    run = train(policy, loop_tokenizer, world, tamper=shuffle_advantages_across_groups)
    assert run.rise < 0.1, run.rewards


def test_the_same_seed_gives_the_same_run_step_for_step(policy, tokenizer, world):
    # each run with its own memory: the second renders everything again, as the first did
    first = train(policy, RememberingTokenizer(tokenizer), world, steps=3)
    again = train(policy, RememberingTokenizer(tokenizer), world, steps=3)
    assert first.rewards == again.rewards and first.losses == again.losses
    assert np.array_equal(first.params, again.params)

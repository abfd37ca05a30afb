"""The production engine and the plain reference step agree: for the same sampler, search and
seeds, ``rollout_batch_async`` (concurrent, one state machine per trajectory) followed by the
trainer's scoring, advantages and datums gives exactly the trajectories and datums of
:mod:`searchr1.core.reference` (one trajectory after another), whatever the budgets. The budgets
are cut from the trajectories' own lengths (exactly, one under, one over), so every budget check
is met at its edge; and the reference shares no helper with the engine, so a bug in one of the
engine's helpers shows as a difference."""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from remembering_tokenizer import RememberingTokenizer
from twin_support import MODEL

import searchr1.core.reference
import searchr1.core.reference_text
from searchr1.core.advantage import assign_group_advantages
from searchr1.core.datum import build_training_datums, drop_out_of_vocab
from searchr1.core.observation.text import observation_candidates
from searchr1.core.protocol import observation_tokens
from searchr1.core.credit import assign_step_advantages, assign_step_rewards
from searchr1.core.reference import (reference_datums, reference_rollout, reference_rewards_and_advantages, reference_step,
                                     reference_turn_credit)
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.core.budgets import TOOL_OVERFLOW_MODES
from searchr1.core.types import MAX_TOKENS, SearchExample, SearchItem, SearchResult, Trajectory
from searchr1.core.update import UpdateConfig, apply_update
from searchr1.twin import start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.offline_world import load_world, passages_by_query
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy
from searchr1.twin.scripted_search import ScriptedSearch

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
JSON_CALL = "<tool_call>{\"name\": \"search\"}</tool_call>"
NOTHING = SearchResult(True, ())


def item(title: str, words: int, source: str | None = "Wikipedia", url: str | None = "") -> SearchItem:
    return SearchItem(title, " ".join(f"{title.lower()}{i}" for i in range(words)), source,
                      f"https://w/{title}" if url == "" else url)


SCRIPTED_RESULTS = {
    "alpha": SearchResult(True, (item("Alpha", 12), item("Beta", 40), item("Gamma", 80))),
    "beta": SearchResult(True, ()),
    "gamma": SearchResult(False, (), status=503, error="HTTP 503"),
    "long": SearchResult(True, (item("Long", 250), item("Short", 5))),
    # every layout of an item (evidence, title with source and url, source only, url only), a long one, and
    # one whose text ends in spaces (the template trims the message)
    "many": SearchResult(True, (item("Evidence", 9, None, None), item("Both", 20), item("Source", 6, url=None),
                                item("Url", 7, None), item("Big", 150),
                                SearchItem("Tail", "tail0 tail1 \n\n ", None, None),  # ends in spaces
                                SearchItem("Page", "page0 page1", "wiki-18", None, "page-0-1"))),  # with its id
    "silent": SearchResult(False, ()),  # a failure without a message
}
SAMPLES = [  # one list of assistant turns per sample (samples sharing their history script the same next turn)
    [CALL.format("alpha"), "Answer: France"],
    [CALL.format("long"), CALL.format("alpha"), "Answer: Paris"],
    ["Thinking first.\n\n" + CALL.format("beta"), CALL.format("alpha"), CALL.format("long"), "Answer: France"],
    [JSON_CALL],
    ["Answer: France"],
    [CALL.format("gamma"), "Answer: France"],
    [JSON_CALL + "\nAnswer: France"],  # breaks the protocol AND carries an Answer: line: never a reward
    ["Answer: France\n\n" + CALL.format("many"), "Answer: France"],  # a valid call after an Answer: line
    [CALL.format("many"), CALL.format("unknown"), CALL.format("many"), "Answer: Spain"],
    ["I do not know."],
    [CALL.format("silent"), "Answer: France"],
    ["Answer:\nFrance"],  # the answer on the line after Answer:
]
# 1.0 + 0.0 + ten times -0.1 is 0 in real numbers: the wrong answer sits at its group's mean (in
# floating point the mean misses 0 by 2**-54 / 12, which both sides must compute alike)
AT_THE_MEAN = [["Answer: France"], ["Answer: Spain"]] + [["I do not know."]] * 10
SCRIPTED = parse_scenario({"questions": [
    {"id": f"q{i}", "question": f"Question {i}?", "answers": ["France"], "data_source": "nq",
     "samples": SAMPLES[i:] + SAMPLES[:i]} for i in range(3)]
    + [{"id": "mean", "question": "Question at the mean?", "answers": ["France"], "samples": AT_THE_MEAN}]})
GROUP_SIZES = (2, len(AT_THE_MEAN))


class RememberingSampler:
    """A twin's sampling client that answers a request it has answered before from memory.

    A twin's policy answers the same prompt, sample count and sampling parameters with the same
    sequences (that is what lets the engine and the reference be compared at all), so a
    remembered answer is the one the twin would send again. The reference makes the engine's
    requests one after another, and the examples repeat many of them: those are answered here
    instead of through the SDK, HTTP and the twin's handler threads. A request the two sides
    make differently still goes to the twin, so a difference between them still shows."""

    def __init__(self, inner):
        self.inner = inner
        self.answers = {}

    @staticmethod
    def key(prompt, num_samples, sampling_params, options):
        return (tuple(prompt.to_ints()), num_samples, None if sampling_params is None else
                sampling_params.model_dump_json(), tuple(sorted(options.items())))

    async def sample_async(self, prompt, num_samples=1, sampling_params=None, **options):
        key = self.key(prompt, num_samples, sampling_params, options)
        if key not in self.answers:
            self.answers[key] = await self.inner.sample_async(prompt=prompt, num_samples=num_samples,
                                                              sampling_params=sampling_params, **options)
        return self.answers[key]

    def sample(self, prompt, num_samples=1, sampling_params=None, **options):
        """The SDK's blocking form: a future whose result is the answer."""
        key = self.key(prompt, num_samples, sampling_params, options)
        if key not in self.answers:
            self.answers[key] = self.inner.sample(prompt=prompt, num_samples=num_samples,
                                                  sampling_params=sampling_params, **options).result()
        answered = concurrent.futures.Future()
        answered.set_result(self.answers[key])
        return answered


@pytest.fixture(scope="module")
def loop_tokenizer(tokenizer) -> RememberingTokenizer:
    """The tokenizer both loops of this module's properties use: the examples replay the same few
    conversations, so each render, encode and decode is asked of the tokenizer once."""
    return RememberingTokenizer(tokenizer)


@pytest.fixture(scope="module")
def twins(tmp_path_factory, tokenizer):
    """A sampler of the twin's scripted policy and of its learning policy (base weights)."""
    scripted = start_twin(home=tmp_path_factory.mktemp("scripted"), tokenizer=tokenizer, policy="toy")
    scripted.policy = ScriptedPolicy(SCRIPTED, tokenizer)
    learning = start_twin(home=tmp_path_factory.mktemp("learning"), tokenizer=tokenizer, policy="learning")
    samplers = {name: RememberingSampler(twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(
                    base_model=MODEL)) for name, twin in (("scripted", scripted), ("learning", learning))}
    yield samplers, learning
    scripted.close()
    learning.close()


def world():
    """The offline world's train questions; each query returns its passage and, after it, the next
    two queries' passages (several items per result)."""
    questions = [q for q in load_world() if q.split == "train"]
    examples = [SearchExample(q.id, q.question, q.answers, q.data_source) for q in questions]
    hops = list(passages_by_query(questions).items())
    results = {query: SearchResult(True, tuple(SearchItem(h.title, h.text, "Wikipedia") for _, h in
                                               (hops + hops)[i:i + 3])) for i, (query, _) in enumerate(hops)}
    return examples, results


def search_tools(results):
    """The reference's tools: search answers a call's query, stripped, from ``results`` (as the
    engine's search tool gives its backend the stripped query)."""
    return {"search": lambda arguments: results.get(str(arguments["query"]).strip(), NOTHING)}


def production(sampler, tokenizer, results, examples, config, step):
    trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(results, default=NOTHING)),
                                                   examples, config, step=step))
    score_trajectories(trajectories)
    assign_group_advantages(trajectories)
    datums, _ = drop_out_of_vocab(build_training_datums(trajectories, max_tokens=config.max_trajectory_tokens),
                                  len(tokenizer))
    return trajectories, datums


def datum_values(datum):
    inputs = datum.loss_fn_inputs
    return (datum.model_input.to_ints(), *(list(inputs[k].data) for k in ("target_tokens", "logprobs", "advantages")))


def exact_match_only(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The engine also records token F1 and cover EM (tests/core/test_reward.py checks them); the
    reference scores what the step trains on, exact match."""
    for t in trajectories:
        if t.reward_result is not None:
            t.reward_result = replace(t.reward_result, f1=0.0, cover_em=False)
    return trajectories


# ---------------------------------------------------------------- budgets at the trajectories' edges

GENEROUS = 32_768  # no trajectory of these policies comes near it
SIZES: dict[tuple[str, bool], int] = {}
MEASURED: dict[tuple, dict[str, list[int]]] = {}  # the edges of one (policy, questions, config, step)


def edges(trajectories: list[Trajectory], tokenizer, results) -> dict[str, list[int]]:
    """Every length at which a budget check of these trajectories flips, by kind:

    * ``searches``, ``turns``: a trajectory's searches and assistant turns (max_search_calls,
      max_assistant_turns);
    * ``completion``: a completion's tokens (max_assistant_tokens);
    * ``prompt``: a prompt's tokens, and ``end``: prompt + completion (max_trajectory_tokens: at
      the prompt's length nothing more can be sampled; at ``end`` the completion just fits);
    * ``next``: a stitched next prompt + 1 (its observation fits with one token left to generate);
      ``items``: the same for the first k < n items of the result, and for a one-letter
      observation (the check before searching);
    * ``content``: the tokens of the first k items of a result (max_tool_response_tokens).

    The engine's own helpers size the observations here: they only choose the inputs, and the
    reference, which does not use them, is what the outputs are compared with.
    """
    def size(text: str, observation: bool) -> int:  # the same texts come back in every example
        key = (text, observation)
        if key not in SIZES:
            SIZES[key] = len(observation_tokens(tokenizer, text) if observation else
                             tokenizer.encode(text, add_special_tokens=False))
        return SIZES[key]
    found: dict[str, list[int]] = {k: [] for k in ("searches", "turns", "completion", "prompt", "end", "next",
                                                  "items", "content")}
    for t in trajectories:
        found["searches"].append(len(t.calls))
        found["turns"].append(len(t.turns))
        for turn in t.turns:
            found["completion"].append(len(turn.completion_tokens))
            found["prompt"].append(len(turn.prompt_tokens))
            found["end"].append(len(turn.prompt_tokens) + len(turn.completion_tokens))
        for search, turn in zip(t.calls, t.turns[1:]):
            candidates = observation_candidates(results.get(search.query, NOTHING))
            base = len(turn.prompt_tokens) - size(search.observation, True)
            found["next"].append(len(turn.prompt_tokens) + 1)
            found["items"].append(base + size("x", True) + 1)
            for k in range(1, len(candidates) + 1):
                joined = "\n\n".join(candidates[:k])
                found["content"].append(size(joined, False))
                found["items"] += [base + size(joined, True) + 1] * (k < len(candidates))
    return found


def at_edge(found: dict[str, list[int]], choice, *, generous: int, least: int, most: int) -> int:
    """``choice`` = (kind, which, offset): that edge (``which`` counted round) moved by ``offset``;
    None, or a kind these trajectories never reach: ``generous``."""
    if choice is None or not found[choice[0]]:
        return generous
    kind, which, offset = choice
    values = sorted(set(found[kind]))
    return min(max(values[which % len(values)] + offset, least), most)


EDGES_EXAMPLE = {"policy": "scripted", "group_size": 6, "overflow": "truncate", "state_budget": True, "seed": 0,
                 "step": 0, "start": 0, "searches": 4, "search_edge": None, "turn_edge": None, "trajectory_edge": None,
                 "content_edge": None, "completion_edge": None}


def at_edges(**changes):
    """An explicit example: the scripted policy, generous budgets but for ``changes``."""
    return example(**{**EDGES_EXAMPLE, **changes})


def edge(*kinds: str):
    return st.one_of(st.none(), st.tuples(st.sampled_from(kinds), st.integers(0, 50), st.sampled_from([-1, 0, 1])))


@pytest.mark.slow  # a hundred rollouts through two twins, and every budget edge (about 20 s)
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(policy=st.sampled_from(["scripted", "learning"]), group_size=st.integers(*GROUP_SIZES),
       overflow=st.sampled_from(TOOL_OVERFLOW_MODES), state_budget=st.booleans(), seed=st.integers(0, 2**20),
       step=st.integers(0, 50), start=st.integers(0, 100), searches=st.integers(0, 4), search_edge=edge("searches"),
       turn_edge=edge("turns"), trajectory_edge=edge("prompt", "end", "next", "items"),
       content_edge=edge("content"), completion_edge=edge("completion"))
# whole groups of 12 (one wrong answer at its group's mean), then each budget exactly at an edge, one
# under and one over (the other budgets generous)
@at_edges(group_size=12, searches=1)
@at_edges(search_edge=("searches", 1, 0))
@at_edges(overflow="end", search_edge=("searches", 1, -1))
@at_edges(state_budget=False, turn_edge=("turns", 2, 0))
@at_edges(state_budget=False, turn_edge=("turns", 2, -1))
@at_edges(seed=1, trajectory_edge=("next", 1, 0))
@at_edges(seed=1, trajectory_edge=("next", 1, -1))
@at_edges(overflow="end", seed=1, trajectory_edge=("next", 1, -1))
@at_edges(seed=2, trajectory_edge=("items", 3, 0))
@at_edges(seed=2, trajectory_edge=("items", 3, -1))
@at_edges(seed=3, trajectory_edge=("prompt", 2, 0))
@at_edges(seed=3, trajectory_edge=("prompt", 2, 1))
@at_edges(seed=3, trajectory_edge=("end", 2, -1))
@at_edges(seed=3, trajectory_edge=("end", 2, 0))
@at_edges(seed=4, content_edge=("content", 2, 0))
@at_edges(seed=4, content_edge=("content", 2, -1))
@at_edges(seed=4, content_edge=("content", 2, 1))
@at_edges(overflow="end", seed=4, content_edge=("content", 0, -1))
@at_edges(seed=5, completion_edge=("completion", 3, 0))
@at_edges(seed=5, completion_edge=("completion", 3, -1))
@at_edges(policy="learning", group_size=4, seed=6, step=1, searches=2, trajectory_edge=("next", 0, 0),
          content_edge=("content", 0, -1))
def test_the_engine_produces_the_reference_trajectories_and_datums_at_every_budget_edge(
        twins, loop_tokenizer, policy, group_size, overflow, state_budget, seed, step, start, searches, search_edge,
        turn_edge, trajectory_edge, content_edge, completion_edge):
    """Invariant: engine(sampler, search, seeds) == reference(sampler, search, seeds), trajectory for
    trajectory (every token, logprob, message, search, termination, score, advantage) and datum for
    datum, for the scripted and the learning policy, in either overflow mode, with each budget
    generous or cut at a length of the trajectories themselves (exactly, one under, one over)."""
    tokenizer = loop_tokenizer
    samplers, _ = twins
    if policy == "scripted":
        examples, results = SCRIPTED.examples, SCRIPTED_RESULTS
    else:
        examples, results = world()
        examples = [examples[(start + i) % len(examples)] for i in range(3)]
        group_size = min(group_size, 6)
    config = RolloutConfig(group_size=group_size, max_search_calls=searches, max_assistant_turns=8,
                           max_trajectory_tokens=GENEROUS, max_assistant_tokens=GENEROUS,
                           max_tool_response_tokens=GENEROUS, tool_overflow=overflow, seed=seed,
                           state_search_budget=state_budget, sample_retry_backoff=0.0)

    def measured(config):  # the same rollout comes back in many examples: measured once
        key = (policy, tuple(e.id for e in examples), config, step)
        if key not in MEASURED:
            MEASURED[key] = edges(production(samplers[policy], tokenizer, results, examples, config, step)[0],
                                  tokenizer, results)
        return MEASURED[key]

    found = measured(config)  # the counts first: the search budget is in the system prompt
    config = replace(config, max_search_calls=at_edge(found, search_edge, generous=searches, least=0, most=100),
                     max_assistant_turns=at_edge(found, turn_edge, generous=8, least=1, most=100))
    if state_budget and config.max_search_calls != searches:  # another prompt: other lengths
        found = measured(config)
    config = replace(
        config,
        max_trajectory_tokens=at_edge(found, trajectory_edge, generous=GENEROUS, least=1, most=MAX_TOKENS),
        max_tool_response_tokens=at_edge(found, content_edge, generous=GENEROUS, least=1, most=MAX_TOKENS),
        max_assistant_tokens=at_edge(found, completion_edge, generous=GENEROUS, least=1, most=MAX_TOKENS))
    trajectories, datums = production(samplers[policy], tokenizer, results, examples, config, step)
    expected = reference_rollout(samplers[policy], tokenizer, search_tools(results), examples, config,
                                 step=step)
    reference_rewards_and_advantages(expected)
    assert exact_match_only(trajectories) == expected
    assert [datum_values(d.datum) for d in datums] == [datum_values(d) for d in
                                                         reference_datums(expected, len(tokenizer))]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 40), seed=st.integers(0, 2**20), step=st.integers(0, 3),
       weight=st.sampled_from([1.0, 0.5, 2.0]), discount=st.sampled_from([0.95, 1.0, 0.0]),
       step_rewards=st.sampled_from([None, (0.1, 0.1), (0.3, 0.05)]))
@example(start=6, seed=1, step=1, weight=1.0, discount=0.95, step_rewards=(0.1, 0.1))  # later states shared, calls repeated
def test_the_engine_gives_the_reference_turn_credit(twins, loop_tokenizer, start, seed, step, weight, discount,
                                                    step_rewards):
    """Invariant: with GiGPO's step credit (and with or without step rewards) the engine's turn
    advantages, step groups and step rewards, and so its datums, are the reference's."""
    samplers, _ = twins
    examples, results = world()
    examples = [examples[(start + i) % len(examples)] for i in range(3)]
    config = RolloutConfig(group_size=6, seed=seed, sample_retry_backoff=0.0)
    trajectories = asyncio.run(rollout_batch_async(samplers["learning"], loop_tokenizer, with_search(
        ScriptedSearch(results, default=NOTHING)), examples, config, step=step))
    score_trajectories(trajectories)
    if step_rewards is not None:
        assign_step_rewards(trajectories, evidence_bonus=step_rewards[0], repeat_penalty=step_rewards[1])
    assign_group_advantages(trajectories)
    assign_step_advantages(trajectories, mode="mean", weight=weight, discount=discount)
    datums, _ = drop_out_of_vocab(build_training_datums(trajectories, max_tokens=config.max_trajectory_tokens),
                                  len(loop_tokenizer))
    expected = reference_rollout(samplers["learning"], loop_tokenizer, search_tools(results), examples, config,
                                 step=step)
    reference_rewards_and_advantages(expected)
    bonus, penalty = step_rewards or (None, 0.0)
    reference_turn_credit(expected, weight=weight, discount=discount, bonus=bonus, penalty=penalty)
    if (start, seed, step) == (6, 1, 1):  # the explicit example reaches what a first turn cannot show
        assert sum(turn.step_group > 1 for t in expected for turn in t.turns[1:]) == 6
        assert sum(1 for t in expected for turn in t.turns if turn.reward and turn.reward < 0) == 3
    assert exact_match_only(trajectories) == expected
    assert [datum_values(d.datum) for d in datums] == [datum_values(d) for d in
                                                         reference_datums(expected, len(loop_tokenizer))]


@pytest.mark.slow  # two training steps through a twin
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
    _, sent, loss = reference_step(samplers["learning"], theirs, tokenizer, search_tools(results),
                                   examples[:4], config, step=0, learning_rate=0.2)
    assert len(sent) == len(datums) and loss == update.outputs[0]


# ---------------------------------------------------------------- the reference stands apart

# the data types, the budgets' settings class, and the tools as data
ALLOWED = {("searchr1.core.types", "*"), ("searchr1.core.budgets", "RolloutBudgets"), ("searchr1.core.tools", "DECLARED"),
           # the system prompt's wording, as data (the reference composes it in its own code)
           *{("searchr1.core.protocol", f"PROMPT_{part}") for part in ("HEAD", "ONE_CALL", "CALLS", "BUDGET", "EXAMPLE")}}
# the reference's two modules: the step, and the text the model reads and writes
REFERENCE_MODULES = (searchr1.core.reference, searchr1.core.reference_text)


def searchr1_imports(source: str) -> list[tuple[str, str]]:
    """Every (module, name) a source imports from the package, wherever the import stands
    (functions, ``if TYPE_CHECKING`` blocks); a relative import counts as the package's."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "searchr1"]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "searchr1"):
            found += [("." * node.level + (node.module or ""), alias.name) for alias in node.names]
    return found


def forbidden(imports: list[tuple[str, str]], allowed=ALLOWED) -> list[tuple[str, str]]:
    return [(m, n) for m, n in imports if (m, "*") not in allowed and (m, n) not in allowed]


def source_of(module) -> str:
    return Path(module.__file__).read_text(encoding="utf-8")


def test_the_reference_imports_from_the_package_only_the_data_types():
    """Invariant: reference.py and its text module (reference_text.py) import nothing from searchr1
    but the data types (``searchr1.core.types``), the budgets (``RolloutBudgets``), the declared
    tools as data (``DECLARED``) and the system prompt's wording (``PROMPT_*``), and the reference its text module: no helper of the engine they
    are held against (parser, stitching, observations, seeds, reward, advantages, datums), nor its
    configuration class."""
    reference, text = (searchr1_imports(source_of(module)) for module in REFERENCE_MODULES)
    assert ("searchr1.core.budgets", "RolloutBudgets") in reference
    assert ("searchr1.core.budgets", "RolloutBudgets") in text
    assert forbidden(reference, ALLOWED | {("searchr1.core.reference_text", "*")}) == []
    assert forbidden(text) == []


def test_the_reference_lines_are_at_most_100_characters():
    """Invariant: no line of reference.py or reference_text.py is longer than 100 characters (the
    step reads as one page)."""
    for module in REFERENCE_MODULES:
        long = [n for n, line in enumerate(source_of(module).splitlines(), 1) if len(line) > 100]
        assert long == [], f"{Path(module.__file__).name}: lines over 100 characters: {long}"


def test_the_import_rule_sees_an_engine_helper_however_it_is_imported():
    """The parse does catch what the rule forbids (the test above can fail)."""
    source = ("from searchr1.core.types import Trajectory\nfrom searchr1.core.rollout import RolloutConfig, "
              "sampling_seed\nimport searchr1.core.protocol\nif True:\n    from .reward import score_answer\n"
              "def f():\n    from searchr1.core.observation.fit import truncate_to_fit\n")
    assert forbidden(searchr1_imports(source)) == [
        ("searchr1.core.rollout", "RolloutConfig"), ("searchr1.core.rollout", "sampling_seed"), ("searchr1.core.protocol", ""), (".reward", "score_answer"),
        ("searchr1.core.observation.fit", "truncate_to_fit")]


# ---------------------------------------------------------------- declared tools: two, parallel calls, refusals

PAGE = ("<tool_call>\n<function=open_page>\n<parameter=page>\n{}\n</parameter>\n<parameter=offset>\n{}\n</parameter>\n"
        "</function>\n</tool_call>")
UNKNOWN = "<tool_call>\n<function=calculator>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
NO_PAGE = "<tool_call>\n<function=open_page>\n<parameter=offset>\n1\n</parameter>\n</function>\n</tool_call>"
TOOL_SAMPLES = [
    [CALL.format("alpha"), PAGE.format("Alpha", 0), "Answer: France"],
    [CALL.format("alpha") + "\n" + PAGE.format("Beta", 1), "Answer: France"],  # two calls in one turn
    [PAGE.format("Gamma", "two"), PAGE.format("Gamma", 2), "Answer: Spain"],  # a mistyped offset, then right
    [UNKNOWN, "Answer: France"],
    [NO_PAGE + "\n" + CALL.format("long"), CALL.format("many"), "Answer: France"],
    [CALL.format("alpha") + "\n" + CALL.format("beta") + "\n" + PAGE.format("Alpha", 1), "Answer: France"],
    [PAGE.format("Long", 0), PAGE.format("Long", 1), PAGE.format("Long", 2), PAGE.format("Long", 3),
     PAGE.format("Long", 4), "Answer: France"],  # past open_page's budget of 4
    [CALL.format("gamma") + "\n" + PAGE.format("Alpha", 0), "Answer: France"],  # a failed search beside a page
    [PAGE.format(" ", 0), PAGE.format("Alpha", -1), PAGE.format("Alpha", 1), "Answer: France"],  # blank, negative
]
TOOLS_SCENARIO = parse_scenario({"questions": [
    {"id": f"t{i}", "question": f"Tool question {i}?", "answers": ["France"], "data_source": "nq",
     "samples": TOOL_SAMPLES[i:] + TOOL_SAMPLES[:i]} for i in range(2)]})


def page_result(arguments) -> SearchResult:
    """A page of 3 passages per title (the long page's passages are long), from ``offset`` on."""
    title, offset = str(arguments["page"]), int(arguments.get("offset", 0))
    words = 90 if title == "Long" else 8
    return SearchResult(True, tuple(item(f"{title} {k + 1}/3", words, "Page", None) for k in range(offset, 3)))


class PageBackend:
    async def call(self, call):
        return page_result(call.arguments)


@pytest.fixture(scope="module")
def tool_sampler(tmp_path_factory, tokenizer):
    twin = start_twin(home=tmp_path_factory.mktemp("tools"), tokenizer=tokenizer, policy="toy")
    twin.policy = ScriptedPolicy(TOOLS_SCENARIO, tokenizer)
    yield RememberingSampler(twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(base_model=MODEL))
    twin.close()


@pytest.mark.slow  # forty pairs of rollouts through a twin (about 15 s)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tools=st.sampled_from(["search", "search,open_page", "open_page,search"]), calls=st.integers(1, 3),
       invalid=st.sampled_from(["end", "observe"]), overflow=st.sampled_from(TOOL_OVERFLOW_MODES),
       searches=st.integers(0, 4), turns=st.integers(1, 8), room=st.integers(500, 2500) | st.just(GENEROUS),
       cap=st.integers(1, 300) | st.just(GENEROUS), seed=st.integers(0, 2**20))
@example(tools="search,open_page", calls=3, invalid="observe", overflow="truncate", searches=4, turns=8,
         room=GENEROUS, cap=GENEROUS, seed=0)
@example(tools="search,open_page", calls=2, invalid="observe", overflow="truncate", searches=4, turns=8, room=900,
         cap=60, seed=0)
@example(tools="search,open_page", calls=3, invalid="observe", overflow="truncate", searches=4, turns=8, room=800,
         cap=GENEROUS, seed=0)  # tight: the later calls of a turn live on the room the first one leaves them
def test_the_engine_produces_the_reference_trajectories_with_declared_tools(
        tool_sampler, loop_tokenizer, tools, calls, invalid, overflow, searches, turns, room, cap, seed):
    """Invariant: engine == reference with one or two declared tools, one to three calls a turn and
    either refused-call policy, whatever the budgets: every token, message, call record, refusal and
    termination, and every datum."""
    tokenizer = loop_tokenizer
    config = RolloutConfig(group_size=len(TOOL_SAMPLES), tools=tools, max_calls_per_turn=calls, invalid_calls=invalid,
                           tool_overflow=overflow, max_search_calls=searches, max_assistant_turns=turns,
                           max_trajectory_tokens=room, max_tool_response_tokens=cap, seed=seed,
                           sample_retry_backoff=0.0)
    tools = with_search(ScriptedSearch(SCRIPTED_RESULTS, default=NOTHING), {"open_page": PageBackend()})
    trajectories = asyncio.run(rollout_batch_async(tool_sampler, tokenizer, tools, TOOLS_SCENARIO.examples, config))
    score_trajectories(trajectories)
    assign_group_advantages(trajectories)
    datums, _ = drop_out_of_vocab(build_training_datums(trajectories, max_tokens=room), len(tokenizer))
    reference_tools = {**search_tools(SCRIPTED_RESULTS), "open_page": page_result}
    expected = reference_rollout(tool_sampler, tokenizer, reference_tools, TOOLS_SCENARIO.examples, config)
    reference_rewards_and_advantages(expected)
    assert exact_match_only(trajectories) == expected
    assert [datum_values(d.datum) for d in datums] == [datum_values(d) for d in
                                                         reference_datums(expected, len(tokenizer))]


@given(tools=st.sampled_from([("search",), ("search", "open_page"), ("open_page", "search")]),
       calls=st.integers(1, 3), stated=st.booleans(),
       description=st.none() | st.text(min_size=1, max_size=40),
       system=st.none() | st.text(max_size=40).map(lambda text: text + " {max_search_calls} {x}"))
def test_the_reference_tells_the_model_what_the_engine_tells_it(tools, calls, stated, description, system):
    """Invariant: for any tool list, calls a turn, stated budget, tool description and system prompt
    of the user's, the reference's system message and tool schemas are the engine's (the equality
    properties above draw none of these wordings)."""
    from searchr1.core.budgets import RolloutBudgets, tool_schemas
    from searchr1.core.rollout import effective_system_prompt
    from searchr1.core.reference_text import system_message, tool_schemas as reference_schemas

    budgets = RolloutBudgets(tools=tools, max_calls_per_turn=calls, state_search_budget=stated,
                             tool_description=description, system_prompt=system)
    assert system_message(budgets) == {"role": "system", "content": effective_system_prompt(budgets)}
    assert reference_schemas(budgets) == tool_schemas(budgets)

"""Rollout engine: budgets, stitching, isolation, determinism and concurrency, with the real
tokenizer, the real pytrio sampling client against the twin serving a scripted policy, and an
in-memory search backend."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from pytrio import PyTrioError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twin_support import MODEL

from searchr1.core.advantage import assign_group_advantages, summarize_groups
from searchr1.core.reward import score_trajectories
from searchr1.training.step_metrics import rollout_metrics
from searchr1.core.protocol import missing_closing, observation_tokens, template_boundaries
from searchr1.core.observation.fit import TRUNCATION_MARKER
from searchr1.core.tools import shown_call
from searchr1.core.rollout import (
    MalformedSampleError,
    RolloutConfig,
    effective_system_prompt,
    SamplerFailureError,
    make_request,
    rollout_batch_async,
    sampling_seed,
)
from searchr1.search.tool import with_search
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.core.types import CallRecord, SearchExample, SearchItem, SearchResult, Trajectory
from searchr1.twin import Latencies, TwinFaults, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
FAST = dict(sample_retry_backoff=0.0)


def call(query: str, planning: str = "") -> str:
    return f"{planning}\n\n{CALL.format(query)}" if planning else CALL.format(query)


def item(title: str, words: int = 12) -> SearchItem:
    return SearchItem(title, " ".join(f"{title.lower()}{i}" for i in range(words)), "Wikipedia", f"https://w/{title}")


RESULTS = {
    "alpha": SearchResult(True, (item("Alpha"), item("Beta"), item("Gamma"))),
    "beta": SearchResult(True, ()),
    "gamma": SearchResult(False, (), status=503, error="HTTP 503"),
    "long": SearchResult(True, (item("Long", 600), item("Short", 5))),
}


def scenario(questions):
    return parse_scenario({"questions": questions})


def question(qid, samples, answers=("France",), text=None):
    return {"id": qid, "question": text or f"Question {qid}?", "answers": list(answers),
            "data_source": "nq", "samples": samples}


class Served:
    """A running twin and a base-model sampling client on it (the scripted policy is swapped in
    per rollout: it ignores the weights)."""

    def __init__(self, home, tokenizer, **options):
        self.twin = start_twin(home=home, tokenizer=tokenizer, policy="toy", **options)
        service = self.twin.service_client(sdk_options=FAST_RETRIES)
        self.sampler = service.create_sampling_client(base_model=MODEL)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    served = Served(tmp_path_factory.mktemp("twin"), tokenizer)
    yield served
    served.twin.close()


@pytest.fixture
def serve(tmp_path_factory, tokenizer):
    """A twin of its own (faults, latencies) for one test."""
    started = []

    def start(**options):
        started.append(Served(tmp_path_factory.mktemp("twin"), tokenizer, **options))
        return started[-1]
    yield start
    for served in started:
        served.twin.close()


def rollout_batch(sampler, tokenizer, search, examples, config, **kw):
    """The engine's batch, then scored and ranked as the trainer's step does."""
    trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(search), examples, config, **kw))
    score_trajectories(trajectories)
    assign_group_advantages(trajectories)
    return trajectories


def run(served, tokenizer, questions, config=None, search=None, **kw):
    sc = scenario(questions)
    policy = served.twin.policy = ScriptedPolicy(sc, tokenizer)
    search = search or ScriptedSearch(RESULTS)
    config = config or RolloutConfig(group_size=len(questions[0]["samples"]), **FAST)
    return rollout_batch(served.sampler, tokenizer, search, sc.examples, config, **kw), policy, search


# ----------------------------------------------------------------------------- terminations


def test_answer_invalid_and_search_terminations(served, tokenizer):
    samples = [
        [call("alpha"), "Answer: France"],
        ["Answer: Spain"],
        ['<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'],
        [call("alpha", "Let me look."), "Answer: Italy"],
    ]
    trajectories, _, _ = run(served, tokenizer, [question("q", samples)])
    assert [t.termination for t in trajectories] == ["answer", "answer", "invalid", "answer"]
    assert [t.reward for t in trajectories] == [1.0, 0.0, -0.1, 0.0]
    assert [t.search_calls for t in trajectories] == [1, 0, 0, 1]
    mean = sum(t.reward for t in trajectories) / 4
    assert [t.advantage for t in trajectories] == pytest.approx([r - mean for r in (1.0, 0.0, -0.1, 0.0)])


def test_a_reply_without_a_tool_call_or_a_scorable_answer_ends_as_no_answer(served, tokenizer):
    samples = [
        ["Answer: France"],
        ["I think it is France."],  # no Answer: line
        ["Answer: France\nAnswer: Spain"],  # two answers: none can be scored
        [call("alpha"), "Answer:   "],  # an empty answer after a search
    ]
    trajectories, _, _ = run(served, tokenizer, [question("q", samples)])
    assert [t.termination for t in trajectories] == ["answer", "no_answer", "no_answer", "no_answer"]
    assert [t.score.valid_format for t in trajectories] == [True, False, False, False]
    assert [t.reward for t in trajectories] == [1.0, -0.1, -0.1, -0.1]
    metrics = rollout_metrics(trajectories, summarize_groups(trajectories))
    assert metrics["rollout/termination/answer"] == metrics["reward/format"] == 0.25
    assert metrics["rollout/termination/no_answer"] == 0.75


def test_a_tool_call_after_the_search_budget_ends_the_trajectory(served, tokenizer):
    samples = [[call("alpha"), call("beta"), call("alpha", "Answer: France"), "Answer: France"]]
    config = RolloutConfig(group_size=1, max_search_calls=2, **FAST)
    (t,), _, search = run(served, tokenizer, [question("q", samples)], config)
    assert t.termination == "search_budget"
    assert t.search_calls == 2 and len(search.calls) == 2
    assert t.final_text == samples[0][2]
    # the lab port scored this turn's "Answer: France" as 1.0; a tool call is not an answer
    assert (t.reward, t.score.valid_format) == (-0.1, False)


def test_the_turn_budget_binds_when_lower_than_the_search_budget(served, tokenizer):
    samples = [[call("alpha"), call("beta"), "Answer: France"]]
    config = RolloutConfig(group_size=1, max_assistant_turns=2, **FAST)
    (t,), _, _ = run(served, tokenizer, [question("q", samples)], config)
    assert t.termination == "turn_budget" and len(t.turns) == 2 and t.search_calls == 1


def test_search_errors_become_observations_and_flag_the_trajectory(served, tokenizer):
    samples = [[call("gamma"), "Answer: France"], ["Answer: France"]]
    trajectories, _, _ = run(served, tokenizer, [question("q", samples)])
    failed = trajectories[0]
    assert failed.env_error and failed.calls[0].observation == "Search error: HTTP 503"
    assert failed.search_calls == 1  # a failed search still spends budget, as in the lab port
    assert {t.excluded for t in trajectories} == {"env_failure_group"}


def test_no_results_is_not_an_environment_error(served, tokenizer):
    (t,), _, _ = run(served, tokenizer, [question("q", [[call("beta"), "Answer: France"]])],
                     RolloutConfig(group_size=1, **FAST))
    assert t.calls[0].observation == "Search returned no results." and not t.env_error


def test_a_completion_cut_by_max_tokens_stops_with_length(served, tokenizer):
    long_answer = "word " * 50 + "\nAnswer: France"
    config = RolloutConfig(group_size=1, max_assistant_tokens=10, **FAST)
    (t,), _, _ = run(served, tokenizer, [question("q", [[long_answer]])], config)
    assert t.turns[0].stop_reason == "length" and len(t.turns[0].completion_tokens) == 10
    assert t.reward == -0.1


def test_a_prompt_longer_than_the_budget_ends_every_sample_visibly(served, tokenizer):
    config = RolloutConfig(group_size=2, max_trajectory_tokens=50, **FAST)
    trajectories, policy, _ = run(served, tokenizer, [question("q", [["Answer: x"], ["Answer: y"]])], config)
    assert [t.termination for t in trajectories] == ["prompt_too_long"] * 2
    assert policy.calls == []


def test_items_are_added_whole_and_greedily_until_the_tool_budget(served, tokenizer):
    one = len(tokenizer.encode(RESULTS["alpha"].items and "[1] Title: Alpha\n    Content: "
                               + RESULTS["alpha"].items[0].content + "\n    Source: Wikipedia\n    URL: https://w/Alpha"))
    config = RolloutConfig(group_size=1, max_tool_response_tokens=one + 5, **FAST)
    (t,), _, _ = run(served, tokenizer, [question("q", [[call("alpha"), "Answer: France"]])], config)
    observation = t.calls[0].observation
    assert observation.startswith("[1] Title: Alpha") and "[2]" not in observation
    assert not t.calls[0].truncated


def test_an_oversized_first_item_is_truncated_with_a_marker(served, tokenizer):
    config = RolloutConfig(group_size=1, max_tool_response_tokens=100, **FAST)
    (t,), _, _ = run(served, tokenizer, [question("q", [[call("long"), "Answer: France"]])], config)
    record = t.calls[0]
    assert record.truncated and record.observation.endswith(TRUNCATION_MARKER)
    assert len(tokenizer.encode(record.observation)) <= 100
    assert t.termination == "answer"


def test_the_lab_port_overflow_mode_ends_the_trajectory_instead(served, tokenizer):
    config = RolloutConfig(group_size=1, max_tool_response_tokens=100, tool_overflow="end", **FAST)
    (t,), _, _ = run(served, tokenizer, [question("q", [[call("long"), "Answer: France"]])], config)
    assert t.termination == "tool_overflow" and t.reward == -0.1 and t.search_calls == 0


def test_make_request_caps_max_tokens_by_the_remaining_budget(tokenizer):
    from searchr1.core.types import SearchExample
    from searchr1.core.protocol import initial_messages

    t = Trajectory(SearchExample("i", "Q?", ("a",), "nq"), 0, 0, initial_messages("Q?"))
    t.next_prompt_tokens = [1] * 1000
    request = make_request(tokenizer, [t], 7, RolloutConfig(max_trajectory_tokens=1500))
    assert request.max_tokens == 500 and request.seed == 7
    assert make_request(tokenizer, [t], 7, RolloutConfig(max_assistant_tokens=300)).max_tokens == 300
    t.turns.append(object())
    assert make_request(tokenizer, [t], 7, RolloutConfig(max_trajectory_tokens=1000)) is None
    assert t.termination == "token_budget"


def test_seeds_differ_across_steps_questions_samples_and_turns():
    seeds = {sampling_seed(42, s, q, g, k) for s in range(3) for q in range(3) for g in range(3) for k in range(3)}
    assert len(seeds) == 81 and all(0 <= s < 2**31 for s in seeds)


# ----------------------------------------------------------------------------- sampler failures


def test_a_sampler_that_times_out_is_asked_again(serve, tokenizer):
    """The rollout's own retry: the first request sends nothing within ``sample_timeout``."""
    served = serve(faults=TwinFaults(sample_timeouts={1}, sample_timeout_hold=1.0))
    config = RolloutConfig(group_size=1, sample_retries=2, sample_timeout=0.3, **FAST)
    (t,), policy, _ = run(served, tokenizer, [question("q", [["Answer: France"]])], config)
    assert t.termination == "answer" and served.twin.calls("sample") == 2


def test_5xx_sampler_answers_are_retried_by_the_sdk(serve, tokenizer):
    served = serve(faults=TwinFaults(http_errors={"sample": {1: 503, 2: 502}}))
    (t,), policy, _ = run(served, tokenizer, [question("q", [["Answer: France"]])],
                          RolloutConfig(group_size=1, sample_retries=0, **FAST))
    assert t.termination == "answer" and served.twin.calls("sample") == 3 and len(policy.calls) == 1


def test_a_trajectory_whose_sampling_fails_ends_without_crashing_the_batch(served, tokenizer):
    """The twin refuses the second turn of one sample (its script has none): that trajectory
    ends as a sampler error; every other trajectory finishes."""
    questions = [question(f"ok{i}", [[call("alpha"), "Answer: France"], ["Answer: x"]]) for i in range(4)]
    questions.append(question("bad", [[call("alpha")], ["Answer: x"]]))
    trajectories, _, _ = run(served, tokenizer, questions, RolloutConfig(group_size=2, sample_retries=1, **FAST))
    bad = [t for t in trajectories if t.example.id == "bad"]
    assert [t.termination for t in bad] == ["sampler_error", "answer"]
    assert all(t.excluded == "env_failure_group" for t in bad)
    assert all(t.termination == "answer" for t in trajectories if t.example.id != "bad")


def test_too_many_sampler_failures_raise_a_clear_error(serve, tokenizer):
    served = serve(faults=TwinFaults(http_errors={"sample": {n: 400 for n in range(1, 9)}}))
    with pytest.raises(SamplerFailureError, match="could not be sampled.*ActorAPIError"):
        run(served, tokenizer, [question("q", [["Answer: x"], ["Answer: y"]])])


def test_a_prompt_the_scenario_does_not_know_names_the_question_and_turn(served, tokenizer):
    samples = [[call("alpha")]]  # the script ends on a tool call: the engine asks for turn 2
    with pytest.raises(SamplerFailureError, match=r"question 'q' turn 2"):
        run(served, tokenizer, [question("q", samples)], RolloutConfig(group_size=1, **FAST))


def test_an_invalid_turn_is_a_format_failure_even_with_a_right_answer_in_it(served, tokenizer):
    samples = [[call("alpha") + "\nAnswer: France"], ["Answer: France"]]
    trajectories, _, _ = run(served, tokenizer, [question("q", samples)])
    assert [(t.termination, t.reward) for t in trajectories] == [("invalid", -0.1), ("answer", 1.0)]


def test_a_harness_error_in_search_propagates(served, tokenizer):
    with pytest.raises(KeyError, match="unknown"):
        run(served, tokenizer, [question("q", [[call("unknown"), "Answer: x"]])], RolloutConfig(group_size=1, **FAST))


def test_a_result_that_cannot_become_an_observation_ends_only_its_trajectory_as_a_search_error(
        served, tokenizer, caplog):
    # A lone surrogate that slipped past every edge: the tokenizer refuses it (TypeError).
    bad = SearchResult(True, (SearchItem("Broken", "text with a \ud800 lone surrogate", "Wikipedia"),), cached=True)
    query = "broken " + "x" * 90  # logged cut to its first 80 characters
    search = ScriptedSearch({**RESULTS, query: bad})
    samples = [[call(query), "Answer: France"], [call("alpha"), "Answer: France"], ["Answer: Spain"]]
    other = [["Answer: France"], ["Answer: Spain"], ["Answer: France"]]
    with caplog.at_level("WARNING", logger="searchr1.core.rollout"):
        trajectories, _, _ = run(served, tokenizer, [question("q", samples), question("r", other)], search=search)
    broken = trajectories[0]
    reason = "the search result could not become an observation (TypeError)"
    assert broken.termination == "search_error" and broken.env_error and broken.search_calls == 1
    assert broken.calls == [CallRecord(query=query, ok=False, observation="", items=1, error=reason, cached=True,
                                       tool="search")]
    assert broken.final_text == call(query)  # the turn that asked for the search
    assert f"query {query[:80]!r}: {reason}; the trajectory ends as a search failure" in caplog.messages
    assert [t.termination for t in trajectories[1:3]] == ["answer", "answer"]
    assert {t.excluded for t in trajectories[:3]} == {"env_failure_group"}  # its group is left out
    assert [t.excluded for t in trajectories[3:]] == [None] * 3  # the other group still trains
    assert trajectories[4].advantage != 0.0


# ----------------------------------------------------------------------------- properties

QUERIES = sorted(RESULTS)


@st.composite
def random_batches(draw):
    group = draw(st.integers(1, 3))
    questions = []
    for q in range(draw(st.integers(1, 3))):
        samples = []
        for j in range(group):
            turns = [call(draw(st.sampled_from(QUERIES)), f"Sample {j} of {q}.")]
            turns += [call(draw(st.sampled_from(QUERIES))) for _ in range(draw(st.integers(0, 4)))]
            turns.append(draw(st.sampled_from(["Answer: France", "Answer: Spain", "no answer", "<tool_call>bad"])))
            samples.append(turns)
        questions.append(question(f"q{q}", samples))
    config = RolloutConfig(
        group_size=group,
        max_search_calls=draw(st.integers(0, 4)),
        max_assistant_turns=draw(st.integers(1, 6)),
        max_trajectory_tokens=draw(st.integers(560, 1600)),
        max_assistant_tokens=draw(st.integers(4, 80)),
        max_tool_response_tokens=draw(st.integers(8, 300)),
        tool_overflow=draw(st.sampled_from(["truncate", "end"])),
        **FAST,
    )
    return questions, config


def _assert_within_budgets(tokenizer, t, config):
    assert t.termination is not None
    assert len(t.turns) <= config.max_assistant_turns
    assert t.search_calls <= config.max_search_calls
    assert t.total_tokens <= config.max_trajectory_tokens
    assert len(t.calls) == len(t.turns) - 1 or t.termination == "prompt_too_long"
    for previous, turn, search in zip(t.turns, t.turns[1:], t.calls):
        grown = previous.prompt_tokens + previous.completion_tokens
        assert turn.prompt_tokens[: len(grown)] == grown
        environment = missing_closing(tokenizer, previous.completion_tokens) + observation_tokens(
            tokenizer, search.observation)
        assert turn.prompt_tokens[len(grown):] == environment
    for turn in t.turns:
        assert len(turn.completion_tokens) == len(turn.logprobs) <= config.max_assistant_tokens


@pytest.mark.slow  # a batch rollout through a twin per example (a second)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(random_batches())
def test_every_trajectory_ends_within_every_budget_and_each_prompt_extends_the_last(served, tokenizer, batch):
    questions, config = batch
    trajectories, _, _ = run(served, tokenizer, questions, config)
    assert len(trajectories) == len(questions) * config.group_size
    assert [(t.question_index, t.group_index) for t in trajectories] == sorted(
        (t.question_index, t.group_index) for t in trajectories)
    for t in trajectories:
        _assert_within_budgets(tokenizer, t, config)


def _fingerprint(trajectories):
    return [
        (t.question_index, t.group_index, t.termination, t.reward, t.advantage, t.excluded,
         [(x.prompt_tokens, x.completion_tokens, x.logprobs, x.text, x.stop_reason) for x in t.turns],
         [(s.query, s.ok, s.observation, s.truncated) for s in t.calls])
        for t in trajectories
    ]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(random_batches(), st.integers(0, 3))
def test_group_isolation_other_questions_never_change_a_groups_trajectories(served, tokenizer, batch, pick):
    questions, config = batch
    pick %= len(questions)
    baseline = _fingerprint(run(served, tokenizer, questions, config)[0])
    changed = [q if i == pick else question(q["id"], [["Answer: France"]] * config.group_size, text=q["question"])
               for i, q in enumerate(questions)]
    other = _fingerprint(run(served, tokenizer, changed, config)[0])
    mine = [f for f in baseline if f[0] == pick]
    assert [f for f in other if f[0] == pick] == mine


@pytest.mark.slow
def test_results_do_not_depend_on_completion_order(serve, tokenizer):
    questions = [
        question(f"q{q}", [
            [call("alpha", f"Sample {j}."), call(["beta", "gamma", "alpha"][(q + j) % 3]), "Answer: France"]
            for j in range(3)
        ] + [["Answer: Spain"]])
        for q in range(3)
    ]
    runs = []
    for seed in (1, 2, 3):
        served = serve(latencies=Latencies(sample_jitter=0.02, jitter_seed=seed))
        search = ScriptedSearch(RESULTS, latency=lambda q, seed=seed: (hash((q, seed)) % 20) / 1000)
        runs.append(_fingerprint(run(served, tokenizer, questions, RolloutConfig(group_size=4, **FAST),
                                     search=search)[0]))
    assert runs[0] == runs[1] == runs[2]


# ----------------------------------------------------------------------------- concurrency


@pytest.mark.slow
def test_no_trajectory_waits_for_another_trajectorys_search(serve, tokenizer):
    """One sample meets a slow search; its sibling keeps sampling and searching meanwhile."""
    questions = [question("q", [
        [call("slow"), "Answer: France"],
        [call("alpha", "Fast."), call("beta"), call("alpha"), "Answer: France"],
    ])]
    results = dict(RESULTS, slow=SearchResult(True, (item("Slow"),)))
    search = ScriptedSearch(results, latency=lambda q: 1.0 if q == "slow" else 0.01)
    served = serve(latencies=Latencies(sample_request=0.01))
    _, policy, _ = run(served, tokenizer, questions, RolloutConfig(group_size=2, **FAST), search=search)
    slow = next(c for c in search.calls if c.query == "slow")
    fast_turns = [c for c in policy.calls if c.sample_indices == (1,)]
    assert len(fast_turns) == 3
    assert max(c.time for c in fast_turns) + 0.01 < slow.end  # sample 1 finished while sample 0 waited


def _max_overlap(intervals):
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def test_sampling_and_search_caps_are_respected(serve, tokenizer):
    questions = [question(f"q{q}", [[call(["alpha", "beta"][j % 2], f"S{j}."), "Answer: x"] for j in range(4)])
                 for q in range(3)]
    search = ScriptedSearch(RESULTS, latency=lambda q: 0.02, concurrency=2)
    config = RolloutConfig(group_size=4, sampling_concurrency=3, **FAST)
    served = serve(latencies=Latencies(sample_request=0.02))
    _, _, search = run(served, tokenizer, questions, config, search=search)
    assert _max_overlap([(c.start, c.end) for c in served.twin.sample_log]) <= 3
    assert _max_overlap([(c.start, c.end) for c in search.calls]) <= 2
    assert len(search.calls) == 12


async def test_rollout_runs_inside_an_existing_event_loop(served, tokenizer):
    sc = scenario([question("q", [["Answer: France"]])])
    served.twin.policy = ScriptedPolicy(sc, tokenizer)
    trajectories = await rollout_batch_async(served.sampler, tokenizer, with_search(ScriptedSearch({})),
                                             sc.examples, RolloutConfig(group_size=1, **FAST))
    assert trajectories[0].reward_result is None  # the rollout samples; scoring is the caller's next step
    score_trajectories(trajectories)
    assert trajectories[0].reward == 1.0


def test_observation_tokens_in_the_prompt_are_those_the_template_renders(served, tokenizer):
    (t,), _, _ = run(served, tokenizer, [question("q", [[call("alpha"), "Answer: France"]])],
                     RolloutConfig(group_size=1, **FAST))
    first, second = t.turns
    tail = second.prompt_tokens[len(first.prompt_tokens) + len(first.completion_tokens):]
    closing = list(template_boundaries(tokenizer).closing)
    assert tail == closing[1:] + observation_tokens(tokenizer, t.calls[0].observation)


def test_a_question_the_scenario_does_not_know_is_named_with_its_turn(served, tokenizer):
    from searchr1.core.types import SearchExample

    sc = scenario([question("q", [["Answer: France"]])])
    served.twin.policy = ScriptedPolicy(sc, tokenizer)
    stranger = SearchExample("x", "Who painted Guernica?", ("Picasso",), "nq")
    with pytest.raises(SamplerFailureError, match=r"'Who painted Guernica\?' \(turn 1\)"):
        rollout_batch(served.sampler, tokenizer, ScriptedSearch({}), [stranger], RolloutConfig(group_size=1, **FAST))


class FailingSampler:
    """A sampling client whose every request raises ``error``; counts the requests."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.requests = error, 0

    async def sample_async(self, **request):
        self.requests += 1
        raise self.error


def flagged(retryable: object) -> PyTrioError:
    """An SDK error whose ``retryable`` flag is ``retryable`` (pytrio sets it per error)."""
    error = PyTrioError("x" * 300)
    error.retryable = retryable
    return error


@pytest.mark.parametrize(("error", "requests"), [
    (flagged(True), 4),  # the SDK says it is worth another try: 1 + 3 retries
    (flagged("yes"), 1),  # only True itself counts
    (flagged(False), 1), (PyTrioError("x" * 300), 1), (OSError("x" * 300), 1),
    (TimeoutError("x" * 300), 4), (ConnectionError("x" * 300), 4)])
def test_only_retryable_failures_are_asked_again_and_the_first_failure_is_named_in_200_characters(
        tokenizer, caplog, error, requests):
    sampler = FailingSampler(error)
    config = RolloutConfig(group_size=2, sample_retries=3, **FAST)
    example = SearchExample("q", "Question q?", ("France",), "nq")
    with caplog.at_level("WARNING", logger="searchr1.core.rollout"), pytest.raises(SamplerFailureError) as info:
        asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch({})), [example], config, step=0))
    summary = f"{type(error).__name__}: {'x' * 200}"
    assert sampler.requests == requests
    assert str(info.value).endswith(f"(first failure: {summary})")
    assert caplog.messages[-1] == f"sampling failed for good ({summary})"


@pytest.mark.parametrize("state_budget", [True, False])
@pytest.mark.parametrize("custom", [None, "Search at most {max_search_calls} times, then answer."])
def test_the_system_prompt_named_for_a_config_is_the_one_its_trajectories_start_with(served, tokenizer,
                                                                                     state_budget, custom):
    config = RolloutConfig(group_size=1, max_search_calls=3, state_search_budget=state_budget,
                           **({"system_prompt": custom} if custom else {}), **FAST)
    trajectories, _, _ = run(served, tokenizer, [question("q", [["Answer: France"]])], config)
    assert trajectories[0].messages[0] == {"role": "system", "content": effective_system_prompt(config)}
    if custom is not None:  # the budget fills the placeholder only when the prompt states it
        assert effective_system_prompt(config) == custom.replace("{max_search_calls}", "3" if state_budget else "")


def test_a_search_is_recorded_with_what_its_result_says(tokenizer):
    """The query, whether it succeeded, how many items came back, its error and whether the
    cache answered it: each as the result says, on the trajectory's search record."""
    from searchr1.core.protocol import initial_messages
    from searchr1.core.rollout import add_observation, record_turn
    from searchr1.core.types import Turn

    for result in (SearchResult(True, (item("Alpha"), item("Beta")), cached=True),
                   SearchResult(False, (), status=503, error="HTTP 503")):
        config = RolloutConfig()
        t = Trajectory(SearchExample("i", "Q?", ("a",), "nq"), 0, 0, initial_messages("Q?"))
        request = make_request(tokenizer, [t], 0, config)
        text = call("alpha query")
        completion = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        pending = record_turn(t, Turn(request.prompt_tokens, completion, [-0.5] * len(completion), text,
                                               "stop"), tokenizer, config)
        assert pending is not None and shown_call(pending.calls[0]) == "alpha query"
        add_observation(pending, [result], tokenizer, config)
        record = t.calls[-1]
        assert (record.query, record.ok, record.items, record.error, record.cached, record.truncated) == (
            "alpha query", result.ok, len(result.items), result.error, result.cached, False)


def test_a_sampled_sequence_is_read_as_the_sampler_returned_it(tokenizer):
    from searchr1.core.rollout import read_sequence

    tokens = tokenizer.encode("Answer: Paris<|im_end|>", add_special_tokens=False)
    logprobs = [-0.25] * len(tokens)
    # the sampler's own text wins over a decode of its tokens
    assert read_sequence(SimpleNamespace(tokens=tokens, logprobs=logprobs, text="as sent", stop_reason="stop"),
                         tokenizer) == (tokens, logprobs, "as sent", "stop")
    # without text, the tokens are decoded without the control tokens; no stop reason reads as ""
    assert read_sequence(SimpleNamespace(tokens=tokens, logprobs=logprobs, text=None), tokenizer) == (
        tokens, logprobs, "Answer: Paris", "")
    with pytest.raises(MalformedSampleError, match=f"{len(tokens)} tokens but {len(tokens) - 1} logprobs"):
        read_sequence(SimpleNamespace(tokens=tokens, logprobs=logprobs[1:], text=None), tokenizer)


class RecordingSampler:
    """A sampling client that answers every request with an answer turn and keeps what it was asked."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.params = []

    async def sample_async(self, *, prompt, num_samples, sampling_params, return_text):
        self.params.append(sampling_params)
        text = "Answer: France"
        tokens = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        sequence = SimpleNamespace(tokens=tokens, logprobs=[-0.1] * len(tokens), text=text, stop_reason="stop")
        return SimpleNamespace(sequences=[sequence] * num_samples)


def test_requests_carry_the_sampling_settings_and_the_stop_token_and_progress_counts_each_trajectory(tokenizer):
    sampler = RecordingSampler(tokenizer)
    config = RolloutConfig(group_size=3, temperature=0.7, top_p=0.9, **FAST)
    examples = [SearchExample(f"q{i}", f"Question {i}?", ("France",), "nq") for i in range(2)]
    ticks = []
    trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(RESULTS)), examples,
                                                   config, progress_callback=ticks.append))
    assert len(trajectories) == 6 and all(t.termination == "answer" for t in trajectories)
    assert ticks == [1] * 6
    assert sampler.params and all((p.temperature, p.top_p, p.stop) == (0.7, 0.9, ["<|im_end|>"])
                                  for p in sampler.params)


class Retryable(Exception):
    retryable = True


class FlakySampler(RecordingSampler):
    """Fails ``failures`` times with a retryable error, then answers; with ``malformed``, the
    answer's sequence ``malformed`` carries one logprob too few."""

    def __init__(self, tokenizer, failures=0, malformed=None, count=None):
        super().__init__(tokenizer)
        self.failures, self.malformed, self.count = failures, malformed, count

    async def sample_async(self, *, prompt, num_samples, sampling_params, return_text):
        assert return_text is True  # the rollout reads the sampler's own text
        if self.failures:
            self.failures -= 1
            raise Retryable("busy")
        response = await super().sample_async(prompt=prompt, num_samples=num_samples,
                                              sampling_params=sampling_params, return_text=return_text)
        sequences = list(response.sequences)[: self.count or num_samples]
        if self.malformed is not None:
            good = sequences[self.malformed]
            sequences[self.malformed] = SimpleNamespace(tokens=good.tokens, logprobs=good.logprobs[1:], text=good.text)
        return SimpleNamespace(sequences=sequences)


def one_question(tokenizer, sampler, config):
    example = SearchExample("q", "Question?", ("France",), "nq")
    return asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(RESULTS)), [example], config))


def test_retries_wait_the_backoff_doubling_each_time_and_say_so(tokenizer, monkeypatch, caplog):
    import searchr1.core.rollout as rollout

    waits, real_sleep = [], asyncio.sleep

    async def sleep(seconds):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(rollout.asyncio, "sleep", sleep)
    config = RolloutConfig(group_size=2, sample_retries=3, sample_retry_backoff=0.5)
    with caplog.at_level("WARNING", logger=rollout.log.name):
        trajectories = one_question(tokenizer, FlakySampler(tokenizer, failures=3), config)
    assert [t.termination for t in trajectories] == ["answer", "answer"]
    assert waits == [0.5, 1.0, 2.0]
    assert [r.getMessage() for r in caplog.records] == [f"sampling failed (Retryable), retry {k}/3" for k in (1, 2, 3)]


def test_a_malformed_sequence_ends_only_its_own_trajectory(tokenizer):
    config = RolloutConfig(group_size=3, max_sampler_failure_fraction=0.5, **FAST)
    trajectories = one_question(tokenizer, FlakySampler(tokenizer, malformed=1), config)
    assert [t.termination for t in trajectories] == ["answer", "sampler_error", "answer"]


def test_too_few_sequences_fail_the_batch_naming_the_count(tokenizer):
    config = RolloutConfig(group_size=3, sample_retries=0, **FAST)
    with pytest.raises(SamplerFailureError, match="sampler returned 1 sequences for num_samples=3"):
        one_question(tokenizer, FlakySampler(tokenizer, count=1), config)


def test_run_all_raises_the_innermost_first_error_itself():
    from searchr1.core.rollout import run_all

    async def fails():
        raise ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("first")]), ValueError("second")])

    async def waits():
        await asyncio.sleep(10)

    with pytest.raises(KeyError, match="first"):
        asyncio.run(run_all([fails(), waits()]))


def test_a_question_whose_prompt_alone_is_over_budget_is_logged_by_its_id(tokenizer, caplog):
    import searchr1.core.rollout as rollout

    config = RolloutConfig(group_size=2, max_trajectory_tokens=64, **FAST)
    with caplog.at_level("WARNING", logger=rollout.log.name):
        trajectories = one_question(tokenizer, RecordingSampler(tokenizer), config)
    assert [t.termination for t in trajectories] == ["prompt_too_long"] * 2
    assert [r.getMessage() for r in caplog.records] == ["question q: the prompt alone exceeds max_trajectory_tokens"]


class CountingSampler(RecordingSampler):
    """Keeps each request's seed and the most requests it had in flight at once."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.in_flight = self.most_in_flight = 0

    async def sample_async(self, **kwargs):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        try:
            return await super().sample_async(**kwargs)
        finally:
            self.in_flight -= 1


def test_a_batch_starts_at_step_0_numbers_questions_from_where_it_is_told_and_shares_given_slots(tokenizer):
    examples = [SearchExample(f"q{i}", f"Question {i}?", ("France",), "nq") for i in range(4)]
    config = RolloutConfig(group_size=2, sampling_concurrency=8, **FAST)
    sampler = CountingSampler(tokenizer)
    asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(RESULTS)), examples, config))
    assert [p.seed for p in sampler.params] == [sampling_seed(config.seed, 0, q, 0, 0) for q in range(4)]
    assert sampler.most_in_flight > 1

    sampler = CountingSampler(tokenizer)
    trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(RESULTS)), examples,
                                                   config, first_question_index=5, sampling_slots=asyncio.Semaphore(1)))
    assert [t.question_index for t in trajectories] == [5, 5, 6, 6, 7, 7, 8, 8]
    assert sorted(p.seed for p in sampler.params) == sorted(sampling_seed(config.seed, 0, q, 0, 0)
                                                            for q in range(5, 9))
    assert sampler.most_in_flight == 1


def test_a_failure_share_exactly_at_the_limit_is_tolerated(tokenizer):
    config = RolloutConfig(group_size=4, max_sampler_failure_fraction=0.25, **FAST)
    trajectories = one_question(tokenizer, FlakySampler(tokenizer, malformed=2), config)
    assert [t.termination for t in trajectories] == ["answer", "answer", "sampler_error", "answer"]


def test_the_first_request_declares_the_tool_with_the_configured_description(tokenizer):
    from searchr1.core.protocol import initial_messages

    config = RolloutConfig(tool_description="Look things up in the office wiki.")
    t = Trajectory(SearchExample("i", "Q?", ("a",), "nq"), 0, 0, initial_messages("Q?"))
    request = make_request(tokenizer, [t], 0, config)
    assert "Look things up in the office wiki." in tokenizer.decode(request.prompt_tokens)


def test_a_trajectory_ends_once_and_a_second_ending_names_it_and_both_reasons():
    from searchr1.core.types import Termination

    t = Trajectory(SearchExample("i", "Q?", ("a",), "nq"), 3, 1, [])
    t.finish(Termination.ANSWER)
    with pytest.raises(RuntimeError, match=r"q3/g1 already ended \(answer\); cannot end it again as invalid"):
        t.finish(Termination.INVALID)


def test_a_tokenizer_without_an_eos_token_gives_no_stop_strings():
    from searchr1.core.protocol import stop_sequences

    class NoEos:
        pass

    assert stop_sequences(NoEos()) == []


class SearchThenAnswer(RecordingSampler):
    """Calls search on the first turn, answers once the prompt holds a tool response."""

    async def sample_async(self, *, prompt, num_samples, sampling_params, return_text):
        self.params.append(sampling_params)
        searched = "<tool_response>" in self.tokenizer.decode(prompt.to_ints())
        text = "Answer: France" if searched else call("alpha")
        tokens = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        sequence = SimpleNamespace(tokens=tokens, logprobs=[-0.1] * len(tokens), text=text, stop_reason="stop")
        return SimpleNamespace(sequences=[sequence] * num_samples)


def test_every_prompt_of_a_searching_trajectory_declares_the_configured_tool(tokenizer):
    """The stitched prompts after a search render the same tool declaration as the first: the
    template check that each render extends the last holds, and the description is kept."""
    description = "Look things up in the office wiki."
    config = RolloutConfig(group_size=2, tool_description=description, **FAST)
    (first, second) = one_question(tokenizer, SearchThenAnswer(tokenizer), config)
    for t in (first, second):
        assert t.termination == "answer" and len(t.calls) == 1
        assert all(description in tokenizer.decode(turn.prompt_tokens) for turn in t.turns)

"""The rollout with declared tools: a second tool's calls reach its backend and its results come
back as observations, each tool keeps its own budget, and a refused call either ends the
trajectory (``invalid_calls=end``) or is told to the model (``observe``), counted apart from the
environment's failures. Real tokenizer, real pytrio client against the twin's scripted policy."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twin_support import MODEL

from searchr1.core.advantage import assign_group_advantages
from searchr1.core.observation.fit import TRUNCATION_MARKER, fit_calls
from searchr1.core.observation.piecewise import SEPARATOR
from searchr1.core.observation.text import observation_candidates
from searchr1.core.protocol import assistant_message, build_prompt, render, tool_message
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, effective_system_prompt, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.core.tools import OPEN_PAGE, ToolCall
from searchr1.core.types import SearchItem, SearchResult
from searchr1.twin import start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy
from searchr1.twin.scripted_search import ScriptedSearch

SEARCH = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
OPEN = ("<tool_call>\n<function=open_page>\n<parameter=page>\n{}\n</parameter>\n<parameter=offset>\n{}\n"
        "</parameter>\n</function>\n</tool_call>")
TWO_TOOLS = dict(tools="search,open_page", sample_retry_backoff=0.0)
RESULTS = {"tower": SearchResult(True, (SearchItem("Eiffel Tower", "A tower in Paris.", "Wikipedia", None),))}


class Pages:
    """An in-memory page backend: every call is kept, each page is a list of passages."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> SearchResult:
        self.calls.append(call)
        offset = int(call.arguments.get("offset", 0))
        passages = [f"Passage {i} of the {call.arguments['page']} page." for i in range(3)][offset:]
        return SearchResult(True, tuple(SearchItem(f"{call.arguments['page']} ({i + offset + 1}/3)", text, "Page", None)
                                        for i, text in enumerate(passages)))


@pytest.fixture(scope="module")
def sampler(tmp_path_factory, tokenizer):
    twin = start_twin(home=tmp_path_factory.mktemp("twin"), tokenizer=tokenizer, policy="toy")
    yield twin, twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(base_model=MODEL)
    twin.close()


class BrokenPages(Pages):
    """A page backend whose service fails, as a Wikipedia or /retrieve read can."""

    async def call(self, call: ToolCall) -> SearchResult:
        self.calls.append(call)
        return SearchResult(False, (), status=503, error="HTTP 503", attempts=3)


def run(sampler, tokenizer, turns, pages=None, results=RESULTS, **settings):
    twin, client = sampler
    scenario = parse_scenario({"questions": [{"id": "q", "question": "How tall is the Eiffel Tower?",
                                              "answers": ["330 m"], "data_source": "nq", "samples": [turns]}]})
    twin.policy = ScriptedPolicy(scenario, tokenizer)
    pages = Pages() if pages is None else pages
    config = RolloutConfig(group_size=1, **(TWO_TOOLS | settings))
    (trajectory,) = asyncio.run(rollout_batch_async(client, tokenizer,
                                                    with_search(ScriptedSearch(results), {"open_page": pages}),
                                                    scenario.examples, config))
    score_trajectories([trajectory])
    assign_group_advantages([trajectory])
    return trajectory, pages


def test_a_page_opened_after_a_search_is_read_and_recorded_by_its_tool(sampler, tokenizer):
    t, pages = run(sampler, tokenizer, [SEARCH.format("tower"), OPEN.format("Eiffel Tower", 1), "Answer: 330 m"])
    assert t.termination == "answer" and t.reward == 1.0
    assert pages.calls == [ToolCall("open_page", {"page": "Eiffel Tower", "offset": 1})]
    search, page = t.calls
    assert (search.tool, search.refused, search.query) == ("search", False, "tower")
    assert (page.tool, page.refused, page.ok) == ("open_page", False, True)
    assert "Passage 1 of the Eiffel Tower page." in page.observation and "Passage 0" not in page.observation
    assert (t.search_calls, t.calls_of("open_page")) == (1, 1)
    assert t.messages[-2]["name"] == "open_page"
    assert "open_page" in effective_system_prompt(RolloutConfig(**TWO_TOOLS))
    assert "open_page" not in effective_system_prompt(RolloutConfig())


def test_a_failed_page_read_is_the_environments_failure_and_keeps_its_group_out_of_training(sampler, tokenizer):
    t, pages = run(sampler, tokenizer, [OPEN.format("Eiffel Tower", 0), "Answer: 330 m"], pages=BrokenPages())
    (page,) = t.calls
    assert (page.tool, page.ok, page.refused) == ("open_page", False, False)
    assert "Tool error (open_page): HTTP 503" in page.observation
    assert t.env_error and t.excluded == "env_failure_group"  # the right answer earns nothing to train on


class UnreadablePages(Pages):
    """A page backend that returns a passage the tokenizer refuses (a lone surrogate)."""

    async def call(self, call: ToolCall) -> SearchResult:
        self.calls.append(call)
        return SearchResult(True, (SearchItem("Broken", "text with a \ud800 lone surrogate", "Page", None),))


def test_a_page_that_cannot_become_an_observation_ends_the_trajectory_naming_its_tool(sampler, tokenizer):
    t, _ = run(sampler, tokenizer, [OPEN.format("Eiffel Tower", 0), "Answer: 330 m"], pages=UnreadablePages())
    (page,) = t.calls
    assert t.termination == "search_error" and t.env_error
    assert (page.tool, page.ok, page.error) == ("open_page", False,
                                                "the open_page result could not become an observation (TypeError)")


def test_a_search_result_shows_its_passage_id_only_where_open_page_is_offered(sampler, tokenizer):
    with_id = {"tower": SearchResult(True, (SearchItem("Eiffel Tower", "A tower in Paris.", "wiki-18", None,
                                                       "wiki-42"),))}
    turns = [SEARCH.format("tower"), "Answer: 330 m"]
    offered, _ = run(sampler, tokenizer, turns, results=with_id)
    alone, _ = run(sampler, tokenizer, turns, results=with_id, tools="search")
    assert "Title: Eiffel Tower\n    Id: wiki-42\n" in offered.calls[0].observation
    assert "Id:" not in alone.calls[0].observation and "Title: Eiffel Tower" in alone.calls[0].observation


def test_each_tool_keeps_its_own_budget(sampler, tokenizer):
    opens = [OPEN.format("Eiffel Tower", i % 3) for i in range(5)]
    t, pages = run(sampler, tokenizer, [SEARCH.format("tower")] + opens + ["Answer: 330 m"],
                   max_search_calls=1, max_assistant_turns=10)
    assert t.termination == "search_budget"
    assert len(pages.calls) == OPEN_PAGE.budget == 4 and t.search_calls == 1  # search's budget of 1 is its own
    t, pages = run(sampler, tokenizer, [SEARCH.format("tower"), SEARCH.format("tower"), "Answer: 330 m"],
                   max_search_calls=1)
    assert t.termination == "search_budget" and t.search_calls == 1


@pytest.mark.parametrize("policy", ["end", "observe"])
def test_a_refused_call_ends_the_trajectory_or_is_told_to_the_model(sampler, tokenizer, policy):
    bad = "<tool_call>\n<function=open_page>\n<parameter=offset>\ntwo\n</parameter>\n</function>\n</tool_call>"
    t, pages = run(sampler, tokenizer, [bad, "Answer: 330 m"], invalid_calls=policy)
    assert pages.calls == []
    if policy == "end":
        assert t.termination == "invalid" and t.calls == []
        return
    (refused,) = t.calls
    assert t.termination == "answer" and t.reward == 1.0
    assert refused.refused and refused.tool == "open_page"
    assert refused.observation.startswith("Tool error (open_page): parameter offset of open_page must be integer")
    assert not t.env_error and t.excluded != "env_failure_group"  # the policy's own mistake, not the environment's
    assert t.calls_of("open_page") == 0  # a refused call spends no budget


def test_an_unknown_tool_under_observe_names_the_declared_ones(sampler, tokenizer):
    unknown = "<tool_call>\n<function=calculator>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
    t, _ = run(sampler, tokenizer, [unknown, "Answer: 330 m"], invalid_calls="observe")
    assert t.calls[0].observation == (
        "Tool error (calculator): unknown tool 'calculator' (declared: open_page, search)")


def test_a_declared_tool_without_a_backend_is_refused_before_any_sampling(sampler, tokenizer):
    twin, client = sampler
    with pytest.raises(ValueError, match="no backend runs the declared tool 'open_page'"):
        asyncio.run(rollout_batch_async(client, tokenizer, with_search(ScriptedSearch(RESULTS)), [], RolloutConfig(**TWO_TOOLS)))


def test_calls_of_one_turn_run_together_and_answer_in_call_order(sampler, tokenizer):
    both = SEARCH.format("tower") + "\n" + OPEN.format("Eiffel Tower", 2)
    t, pages = run(sampler, tokenizer, [both, "Answer: 330 m"], max_calls_per_turn=2)
    assert t.termination == "answer" and len(t.turns) == 2
    assert [m["role"] for m in t.messages[-4:]] == ["assistant", "tool", "tool", "assistant"]
    assert [m["name"] for m in t.messages[-3:-1]] == ["search", "open_page"]
    search, page = t.calls
    assert search.observation.startswith("[1] Title: Eiffel Tower") and "Passage 2" in page.observation
    assert pages.calls == [ToolCall("open_page", {"page": "Eiffel Tower", "offset": 2})]
    # the second turn's prompt is the first's, the sampled call, the closing and both responses
    observation = t.turns[1].prompt_tokens[len(t.turns[0].prompt_tokens) + len(t.turns[0].completion_tokens):]
    assert tokenizer.decode(observation, skip_special_tokens=False).count("<tool_response>") == 2


def test_a_turn_over_its_call_limit_is_invalid_or_told_and_runs_nothing(sampler, tokenizer):
    both = SEARCH.format("tower") + "\n" + OPEN.format("Eiffel Tower", 2)
    t, pages = run(sampler, tokenizer, [both, "Answer: 330 m"])
    assert t.termination == "invalid" and pages.calls == []
    t, pages = run(sampler, tokenizer, [both, "Answer: 330 m"], invalid_calls="observe")
    (refused,) = t.calls
    assert refused.observation == "Tool error: 2 tool calls in one turn (at most 1)" and pages.calls == []


def test_calls_of_one_turn_count_against_their_tools_budget_together(sampler, tokenizer):
    twice = SEARCH.format("tower") + "\n" + SEARCH.format("tower")
    t, _ = run(sampler, tokenizer, [twice, "Answer: 330 m"], max_calls_per_turn=2, max_search_calls=1)
    assert t.termination == "search_budget" and t.calls == []


def test_under_observe_a_refused_call_beside_a_good_one_is_told_and_the_good_one_runs(sampler, tokenizer):
    bad = "<tool_call>\n<function=open_page>\n<parameter=offset>\n1\n</parameter>\n</function>\n</tool_call>"
    t, pages = run(sampler, tokenizer, [SEARCH.format("tower") + "\n" + bad, "Answer: 330 m"],
                   max_calls_per_turn=2, invalid_calls="observe")
    search, refused = t.calls
    assert search.tool == "search" and not search.refused and search.ok
    assert refused.refused and "needs the parameter page" in refused.observation
    assert pages.calls == [] and t.termination == "answer"


def two_search_turn(tokenizer):
    """A conversation, a turn that calls search twice, its prompt, and the turn as a sampler
    returns it (stop token last)."""
    messages = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": "Which river?"}]
    text = SEARCH.format("Seine") + "\n" + SEARCH.format("Loire")
    completion = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return messages, text, build_prompt(tokenizer, messages), completion


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.integers(-3, 120), cap=st.integers(1, 90), mode=st.sampled_from(["truncate", "end"]))
def test_several_calls_fit_every_budget_and_stitch_to_the_full_render(tokenizer, extra, cap, mode):
    """Two searches' results in one observation: each content within the cap, the next prompt the
    template's render of the whole conversation with one token left to generate, or nothing fits."""
    messages, text, prompt, completion = two_search_turn(tokenizer)
    smallest = len(render(tokenizer, messages + [assistant_message(text), tool_message("a", "x"),
                                                 tool_message("b", "x")], add_generation_prompt=True))
    config = RolloutConfig(max_trajectory_tokens=smallest + extra, max_tool_response_tokens=cap, tool_overflow=mode,
                           max_calls_per_turn=2)
    results = [SearchResult(True, (SearchItem("Seine", "The Seine flows through Paris. " * 4, "Wikipedia"),
                                   SearchItem("Marne", "The Marne joins it.", "Wikipedia"))),
               SearchResult(True, (SearchItem("Loire", "The Loire is the longest river of France.", "Wikipedia"),))]
    fitted = fit_calls(tokenizer, messages, text, prompt, completion,
                       [("a", "search", results[0]), ("b", "search", results[1])], config)
    if fitted is None:  # a one-token cut of each first item, marked, fits any looser budget than these
        cut = len(tokenizer.encode(" [... truncated to fit the budget]", add_special_tokens=False)) + 2
        assert mode == "end" or cap < cut or extra < 2 * cut + 2
        return
    whole = messages + [assistant_message(text)] + [tool_message(i, c) for i, c in zip("ab", fitted.contents)]
    assert fitted.next_prompt == render(tokenizer, whole, add_generation_prompt=True)
    assert len(fitted.next_prompt) <= config.max_trajectory_tokens - 1
    assert all(len(tokenizer.encode(c, add_special_tokens=False)) <= cap for c in fitted.contents)
    assert all(c.endswith("[... truncated to fit the budget]") == cut for c, cut in zip(fitted.contents, fitted.truncated))


@pytest.mark.parametrize("mode", ["end", "truncate"])
def test_an_earlier_call_takes_what_fits_beside_one_letter_for_each_later_call(tokenizer, mode):
    """Calls are fitted in order: the first takes every whole item that fits while each later call
    keeps the room of one letter (marked as cut under ``truncate``), even where a later call then
    fits no whole item. At exactly that room the first call's two items fit: under ``end`` the
    second call's item no longer does, so nothing fits; under ``truncate`` it is cut."""
    messages, text, prompt, completion = two_search_turn(tokenizer)
    first = SearchResult(True, (SearchItem("Seine", "The Seine flows through Paris.", "Wikipedia"),
                                SearchItem("Marne", "The Marne joins the Seine above Paris. " * 6, "Wikipedia")))
    second = SearchResult(True, (SearchItem("Loire", "Long.", "Wikipedia"),))
    both_items = SEPARATOR.join(observation_candidates(first))
    least = "x" + TRUNCATION_MARKER if mode == "truncate" else "x"
    exactly = len(render(tokenizer, messages + [assistant_message(text), tool_message("a", both_items),
                                                tool_message("b", least)], add_generation_prompt=True)) + 1
    config = RolloutConfig(max_trajectory_tokens=exactly, max_tool_response_tokens=10_000, tool_overflow=mode,
                           max_calls_per_turn=2)
    fitted = fit_calls(tokenizer, messages, text, prompt, completion,
                       [("a", "search", first), ("b", "search", second)], config)
    if mode == "end":
        assert fitted is None
    else:
        assert fitted is not None and fitted.contents[0] == both_items and fitted.truncated == (False, True)
        assert len(fitted.next_prompt) == exactly - 1


@pytest.mark.parametrize("policy", ["end", "observe"])
def test_each_declared_tool_has_its_calls_metric_and_a_refused_call_is_counted_under_either_policy(
        sampler, tokenizer, policy):
    from searchr1.core.advantage import summarize_groups
    from searchr1.training.step_metrics import rollout_metrics

    bad = "<tool_call>\n<function=open_page>\n<parameter=offset>\ntwo\n</parameter>\n</function>\n</tool_call>"
    opened, _ = run(sampler, tokenizer, [SEARCH.format("tower"), OPEN.format("Eiffel Tower", 1), "Answer: 330 m"])
    refused, _ = run(sampler, tokenizer, [bad, "Answer: 330 m"], invalid_calls=policy)
    metrics = rollout_metrics([opened, refused], summarize_groups([opened, refused]), ("search", "open_page"))
    assert (metrics["tool/search/calls"], metrics["tool/open_page/calls"]) == (0.5, 0.5)
    assert metrics["tool/invalid_calls"] == 0.5
    assert metrics["rollout/valid_tool_call_rate"] == 2 / 3  # two calls ran, of three turns with a call

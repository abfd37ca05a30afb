"""Context management (``--context fold``): stubs say what a call returned in one line and can carry
no special-token string; folding changes only tool results; a trajectory that outgrows its window
goes on in a new context whose every turn fits it, trained as one datum per context, where
``--context full`` runs out of its budget."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.budgets import RolloutBudgets
from searchr1.core.context import STUB_PREFIX, ContextPolicy, fold_messages, stub
from searchr1.core.datum import build_training_datums, datum_arrays
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.core.settings import SettingError
from searchr1.core.types import CallRecord, Message, SearchItem, SearchResult, Termination
from searchr1.search.tool import with_search
from searchr1.twin import start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy
from searchr1.twin.scripted_search import ScriptedSearch
from twin_support import MODEL

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"


@given(st.text(max_size=300), st.text(max_size=100))
def test_a_stub_is_one_line_naming_the_call_and_holds_no_angle_bracket(observation, query):
    line = stub(CallRecord(query, True, observation, tool="search"))
    assert line.startswith(STUB_PREFIX) and "\n" not in line and "<" not in line and ">" not in line
    assert len(line) <= len(STUB_PREFIX) + 200


def test_a_stub_lists_the_titles_a_search_returned():
    observation = "[1] Title: Paris\n    Content: Capital.\n[2] Title: Seine\n    Content: A river."
    assert stub(CallRecord("paris river", True, observation, tool="search")) == \
        "[folded] search 'paris river' returned: Paris; Seine"


def test_folding_replaces_each_tool_result_by_its_calls_stub_and_nothing_else():
    messages: list[Message] = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": CALL.format("a")},
        {"role": "tool", "tool_call_id": "1", "name": "search", "content": "[1] Title: A\n    Content: long"},
        {"role": "assistant", "content": CALL.format("b")},
        {"role": "tool", "tool_call_id": "2", "name": "search", "content": "[1] Title: B\n    Content: long"}]
    calls = [CallRecord("a", True, messages[3]["content"], tool="search"),
             CallRecord("b", True, messages[5]["content"], tool="search")]
    folded = fold_messages(messages, calls)
    assert [m for m in folded if m["role"] != "tool"] == [m for m in messages if m["role"] != "tool"]
    assert [m["content"] for m in folded if m["role"] == "tool"] == [stub(c) for c in calls]
    assert [m.get("tool_call_id") for m in folded] == [m.get("tool_call_id") for m in messages]


def test_the_window_is_declared_for_fold_only_and_within_the_whole_budget():
    assert RolloutBudgets().window == RolloutBudgets().max_trajectory_tokens
    assert RolloutBudgets(context=ContextPolicy.FOLD, context_window=2048).window == 2048
    with pytest.raises(SettingError, match="--context-window"):
        RolloutBudgets(context_window=2048)
    with pytest.raises(SettingError, match="--context-window"):
        RolloutBudgets(context=ContextPolicy.FOLD, context_window=9000, max_trajectory_tokens=8192)


def page(title: str, words: int) -> SearchResult:
    return SearchResult(True, (SearchItem(title, " ".join(f"{title.lower()}{i}" for i in range(words)), "Wikipedia",
                                          f"https://w/{title}"),))


QUERIES = ["first", "second", "third", "fourth", "fifth"]
RESULTS = {query: page(query.title(), 260) for query in QUERIES}


@pytest.fixture(scope="module")
def sampler(tmp_path_factory, tokenizer):
    with start_twin(home=tmp_path_factory.mktemp("twin"), tokenizer=tokenizer, policy="toy") as twin:
        yield twin, twin.service_client(sdk_options=FAST_RETRIES).create_sampling_client(base_model=MODEL)


def roll(sampler, tokenizer, **settings):
    twin, client = sampler
    turns = [CALL.format(query) for query in QUERIES] + ["Answer: France"]
    scenario = parse_scenario({"questions": [{"id": "q", "question": "Where is the Seine?", "answers": ["France"],
                                              "data_source": "nq", "samples": [turns]}]})
    twin.policy = ScriptedPolicy(scenario, tokenizer)
    config = RolloutConfig(group_size=1, max_search_calls=5, max_assistant_turns=8, max_assistant_tokens=128,
                           sample_retry_backoff=0.0, **settings)
    (trajectory,) = asyncio.run(rollout_batch_async(client, tokenizer, with_search(ScriptedSearch(RESULTS)),
                                                    scenario.examples, config))
    score_trajectories([trajectory])
    return trajectory, config


def test_a_folded_trajectory_reaches_its_answer_where_a_full_one_runs_out(sampler, tokenizer):
    full, _ = roll(sampler, tokenizer, max_trajectory_tokens=2600)
    assert full.termination != Termination.ANSWER and full.folds == 0
    folded, config = roll(sampler, tokenizer, max_trajectory_tokens=8192, context=ContextPolicy.FOLD,
                          context_window=2600)
    assert folded.termination == Termination.ANSWER and folded.reward == 1.0 and folded.folds >= 1
    assert all(len(turn.prompt_tokens) + len(turn.completion_tokens) <= config.window for turn in folded.turns)
    assert [turn.context for turn in folded.turns] == sorted(turn.context for turn in folded.turns)
    assert folded.turns[-1].context == folded.folds
    # the latest result is shown whole, the earlier ones as stubs; the model's own turns stay
    tools = [m["content"] for m in folded.messages if m["role"] == "tool"]
    assert any(content.startswith(STUB_PREFIX) for content in tools[:-1]) and not tools[-1].startswith(STUB_PREFIX)
    assert [m["content"] for m in folded.messages if m["role"] == "assistant"] == \
        [CALL.format(query) for query in QUERIES] + ["Answer: France"]
    # the whole length counts every turn's new tokens, past the window
    assert config.window < folded.whole_tokens <= config.max_trajectory_tokens


def test_each_context_is_one_datum_within_the_window_and_every_completion_token_is_trained_once(sampler, tokenizer):
    folded, config = roll(sampler, tokenizer, max_trajectory_tokens=8192, context=ContextPolicy.FOLD,
                          context_window=2600)
    folded.credit(0.5)
    arrays = datum_arrays(folded)
    assert len(arrays) == folded.folds + 1
    assert [a.first_turn for a in arrays] == [turn_index for turn_index, turn in enumerate(folded.turns)
                                              if turn_index == 0 or turn.context != folded.turns[turn_index - 1].context]
    trained = sum(sum(1 for advantage in a.advantages if advantage) for a in arrays)
    assert trained == sum(len(turn.completion_tokens) for turn in folded.turns)
    datums = build_training_datums([folded], max_tokens=config.window)
    assert len(datums) == folded.folds + 1 and all(d.num_tokens < config.window for d in datums)

"""What the mutants of 2026-12-07 showed untested (docs/mutants.md): exact refusal messages, the
declared search tool's words, values passed on unchanged, and boundaries read exactly as defined.

Each test names, in its docstring, the module whose tests it would otherwise sit beside. Mutation
testing forks every mutant's process after the core is imported, so a module-level declaration
(``SEARCH``, ``DECLARED``) is built by the unmutated code: what a declaration function returns is
checked by calling it.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import numpy as np
import pytest

from searchr1.core import trainer as trainer_module
from searchr1.core.budgets import tool_schemas, unknown_tools
from searchr1.core.objective import LossConfigError, loss_terms, resolve_loss_config
from searchr1.core.observation.tokens import _plain_encoder, forget_remembered_texts, plain_tokens
from searchr1.core.protocol import CLOSED_BOOK_PROMPT, build_prompt, initial_messages, render, render_text, system_prompt
from searchr1.core.rollout import (RolloutConfig, SamplingRuntime, add_observation, effective_system_prompt, record_turn,
                                   rollout_batch_async)
from searchr1.core.settings import SettingError
from searchr1.core.tools import CallError, call_blocks, plain_query, readable_page, search_spec
from searchr1.core.trainer import OnPolicy
from searchr1.core.types import SearchExample, SearchItem, SearchResult, Trajectory, Turn


# ----------------------------------------------------------------------------- core/budgets.py


def test_a_tool_list_with_an_empty_name_or_a_name_twice_is_refused_in_its_own_words():
    """tests/core/test_tool_calls.py: ``unknown_tools`` (what ``--tools`` prints after its flag);
    no tool at all is a closed-book rollout, whose system prompt offers none."""
    assert unknown_tools([]) is None and unknown_tools(()) is None
    assert unknown_tools("") == "names an undeclared tool '' (declared: search, open_page)"
    closed = RolloutConfig(tools=(), max_search_calls=0)
    assert effective_system_prompt(closed) == CLOSED_BOOK_PROMPT and "search" not in CLOSED_BOOK_PROMPT
    twice = "names a tool twice: 'search,search'"
    assert unknown_tools("search, search") == unknown_tools(["search", " search"]) == twice
    assert unknown_tools("search,open_page,search") == "names a tool twice: 'search,open_page,search'"
    with pytest.raises(SettingError, match="^--tools names an undeclared tool 'x'"):
        RolloutConfig(tools=("x",))


# ----------------------------------------------------------------------------- core/tools.py


def test_the_search_tool_declares_the_documented_unit_error_head_and_empty_result():
    """tests/core/test_tool_calls.py: docs/tools.md gives search's unit (``search``), its error
    head (``Search error``) and the text of a result with nothing in it (``Search returned no
    results.``); a description given replaces only the description."""
    for spec in (search_spec(), search_spec("Look it up.")):
        assert (spec.name, spec.unit, spec.error_head, spec.nothing) == (
            "search", "search", "Search error", "Search returned no results.")
    assert search_spec("Look it up.").description == "Look it up."


def test_a_search_query_is_refused_in_its_own_words():
    """tests/core/test_tool_calls.py: ``plain_query``, the rule the schema cannot state."""
    assert plain_query({"query": " \n "}) == "the search query is blank"
    assert plain_query({"query": "a < b"}) == plain_query({"query": "b>"}) == "the search query holds < or >"
    assert plain_query({"query": "Eiffel Tower height"}) is None


def test_a_page_read_is_refused_for_a_blank_name_or_a_negative_offset_only():
    """tests/core/test_tool_calls.py: ``readable_page`` (open_page's check): a page must be named,
    and an offset cannot go back before the start (0 reads from the start, and no offset is 0)."""
    assert readable_page({"page": "  "}) == readable_page({"page": "", "offset": 2}) == "the page name is blank"
    assert readable_page({"page": "Eiffel Tower", "offset": -1}) == "the offset is negative"
    for arguments in ({"page": "Eiffel Tower"}, {"page": "Eiffel Tower", "offset": 0},
                      {"page": "Eiffel Tower", "offset": 3}):
        assert readable_page(arguments) is None


def test_call_blocks_refuses_text_before_the_first_block():
    """tests/core/test_tool_calls.py: ``call_blocks`` returns ``None`` for anything but a run of
    ``<tool_call>`` blocks with only whitespace between and after them, so also for text before
    the first one (even one character)."""
    assert call_blocks("<tool_call>a</tool_call>\n<tool_call>b</tool_call>\n") == ["a", "b"]
    assert call_blocks("x<tool_call>a</tool_call>") is None
    assert call_blocks("Let me look.<tool_call>a</tool_call>") is None


# ----------------------------------------------------------------------------- core/protocol.py


def test_initial_messages_pass_the_system_template_and_the_calls_per_turn_to_the_system_prompt():
    """tests/core/test_protocol.py: ``initial_messages`` is the system prompt of the same settings
    plus the question."""
    template = "Search at most {max_search_calls} times."
    assert initial_messages("Where?", max_search_calls=3, system_template=template) == [
        {"role": "system", "content": "Search at most 3 times."}, {"role": "user", "content": "Where?"}]
    (system, _) = initial_messages("Where?", max_search_calls=3, tools=("search", "open_page"), max_calls=2)
    assert system["content"] == system_prompt(3, None, ("search", "open_page"), 2)
    assert "Make at most 2 tool calls in a turn" in system["content"]


class AddsBos:
    """The real tokenizer, except that its ``encode`` puts a BOS token first unless told not to
    add special tokens (Hugging Face's default, as Llama's tokenizer does)."""

    BOS = 151643  # any id: only its presence is looked for

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def apply_chat_template(self, *args, **kwargs):
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def encode(self, text, add_special_tokens=True):
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return [self.BOS] + ids if add_special_tokens else ids


def test_render_encodes_the_template_text_without_added_special_tokens(tokenizer):
    """tests/core/test_protocol.py: ``render`` is the rendered text encoded without added special
    tokens, as ``apply_chat_template(tokenize=True)`` does, even for a tokenizer that would add
    a BOS by default."""
    messages = initial_messages("Where is Paris?")
    text = render_text(tokenizer, messages, add_generation_prompt=True)
    expected = list(tokenizer.encode(text, add_special_tokens=False))
    assert render(AddsBos(tokenizer), messages, add_generation_prompt=True) == expected
    assert render(tokenizer, messages, add_generation_prompt=True) == expected


# ----------------------------------------------------------------------------- core/objective.py


def test_an_unknown_loss_is_refused_naming_every_loss_the_objective_defines():
    """tests/core/test_objective.py: the refusal lists ``LOSS_CONFIG_DEFAULTS``'s losses in their
    declared order, comma-separated."""
    with pytest.raises(LossConfigError) as refused:
        resolve_loss_config("gspo", {})
    assert str(refused.value) == ("loss_fn 'gspo' is not one the objective defines; choose one of "
                                  "importance_sampling, ppo, cispo, dro, cross_entropy")


def test_a_key_given_to_a_loss_that_takes_none_is_refused_saying_it_takes_no_keys():
    """tests/core/test_objective.py (its parametrised refusal test checks only that the words are
    in the message)."""
    with pytest.raises(LossConfigError) as refused:
        resolve_loss_config("importance_sampling", {"beta": 0.1})
    assert str(refused.value) == ("loss_fn_config key 'beta' is not one 'importance_sampling' takes "
                                  "(no keys; Tinker's documented names)")


@pytest.mark.parametrize(("low", "high", "a"), [(0.8, 1.0, 1.0), (1.0, 1.2, -1.0)])
def test_ppo_keeps_the_gradient_of_a_token_whose_ratio_is_exactly_the_bound_it_is_clipped_at(low, high, a):
    """tests/core/test_objective.py: ppo's gradient is 0 only where ``A > 0`` and ``r > hi``, or
    ``A < 0`` and ``r < lo`` (strictly; the module's definitions); at ``r == hi`` with ``A > 0``
    (or ``r == lo`` with ``A < 0``) the unclipped branch is still a minimum and the gradient is
    ``-r * A``. ``logp == q`` makes the ratio exactly 1, the bound."""
    config = {"clip_low_threshold": low, "clip_high_threshold": high}
    args = (np.array([-1.0]), np.array([-1.0]), np.array([a]), np.ones(1))
    terms, slopes = loss_terms("ppo", config, *args)
    assert terms[0] == -a and slopes[0] == -a


# ----------------------------------------------------------------------------- core/rollout.py


def test_the_sampling_runtime_checks_its_settings_when_built_on_its_own():
    """tests/core/test_setting_rules.py: ``SamplingRuntime`` is declared as ``RolloutBudgets`` is,
    so it holds its rules without ``RolloutConfig`` (which checks both parts itself)."""
    assert SamplingRuntime().sample_retries == 2
    with pytest.raises(SettingError, match="^--sampling-concurrency "):
        SamplingRuntime(sampling_concurrency=0)


OPEN = ("<tool_call>\n<function=open_page>\n<parameter=page>\n{}\n</parameter>\n<parameter=offset>\n{}\n"
        "</parameter>\n</function>\n</tool_call>")


def test_results_that_cannot_become_an_observation_after_a_call_naming_no_tool_say_tool(tokenizer):
    """tests/core/test_tool_rollout.py: the reason a trajectory ends as a search error names the
    first call's tool, and says ``tool`` when that call named none (a refused call the model reads
    under ``invalid_calls=observe``); every call of the turn is recorded with it."""
    config = RolloutConfig(tools="search,open_page", max_calls_per_turn=2, invalid_calls="observe")
    example = SearchExample("q", "How tall is the Eiffel Tower?", ("330 m",), "nq")
    messages = initial_messages(example.question, tools=config.tools, max_calls=2)
    trajectory = Trajectory(example, 0, 0, messages)
    text = "<tool_call>\nnot a function\n</tool_call>\n" + OPEN.format("Eiffel Tower", 0)
    completion = list(tokenizer.encode(text + "<|im_end|>", add_special_tokens=False))
    prompt = build_prompt(tokenizer, messages, tools=tool_schemas(config))
    turn = Turn(prompt, completion, [0.0] * len(completion), text)
    pending = record_turn(trajectory, turn, tokenizer, config)
    assert pending is not None and isinstance(pending.calls[0], CallError) and pending.calls[0].name == ""
    refused = SearchResult(ok=False, error=pending.calls[0].reason)
    unreadable = SearchResult(True, (SearchItem("Broken", "text with a \ud800 lone surrogate", "Page", None),))
    add_observation(pending, [refused, unreadable], tokenizer, config)
    assert trajectory.termination == "search_error"
    reasons = {call.error for call in trajectory.calls}
    assert len(trajectory.calls) == 2 and len(reasons) == 1
    (reason,) = reasons
    assert reason.startswith("the tool result could not become an observation (") and reason.endswith(")")


# ----------------------------------------------------------------------------- core/trainer.py


class SavingClient:
    def __init__(self, sampler):
        self.sampler = sampler

    async def save_weights_and_get_sampling_client_async(self):
        return self.sampler


def test_on_policy_rolls_out_the_step_on_the_watched_sampler_with_its_progress_and_its_slots(monkeypatch):
    """tests/core/test_trainer.py: a step's batch is rolled out on what the watch hands back (its
    sampler, its tools, its progress callback), for that step (the seeds and the sampler version
    are the step's), within the sampling slots the source was given; ``seconds`` is the time the
    batch took."""
    received = {}

    async def recorded(*args, **kwargs):
        bound = inspect.signature(rollout_batch_async).bind(*args, **kwargs)
        bound.apply_defaults()
        received.update(bound.arguments)
        return []

    monkeypatch.setattr(trainer_module, "rollout_batch_async", recorded)
    watched_sampler, watched_tools, slots = object(), {"search": object()}, asyncio.Semaphore(3)
    rollout = RolloutConfig()

    def progress(done: int) -> None:
        pass

    def watch(step, sampler, tools):
        assert sampler == "saved"
        return watched_sampler, watched_tools, progress

    examples = [SearchExample("q", "Where?", ("here",), "nq")]
    source = OnPolicy(SavingClient("saved"), "tokenizer", {"search": object()}, lambda step: examples * step,
                      rollout, watch=watch, sampling_slots=slots)
    before = time.perf_counter()
    batch = asyncio.run(source.batch(3))
    elapsed = time.perf_counter() - before
    assert received == {"sampling_client": watched_sampler, "tokenizer": "tokenizer", "tools": watched_tools,
                        "examples": examples * 3, "config": rollout, "progress_callback": progress, "step": 3,
                        "sampling_slots": slots, "first_question_index": 0, "sampler_version": 3,
                        "turn_sampler": None}  # on-policy, every turn on the step's own sampler
    assert (batch.batch_index, batch.sampler_version, batch.trajectories) == (3, 3, [])
    assert 0.0 <= batch.seconds <= elapsed


# ----------------------------------------------------------------------------- core/observation/tokens.py


def test_forgetting_remembered_texts_starts_the_plain_encoder_again_and_may_be_asked_twice(tokenizer):
    """tests/core/test_observation_safety.py: ``forget_remembered_texts`` (what the benchmarks
    start each pass from) drops the tokenizer's plain encoder with every text it remembers; the
    next encoder encodes alike; forgetting what is not remembered is no error."""
    text = "Paris is the capital of France."
    plain_tokens(tokenizer, text)
    remembered = _plain_encoder(tokenizer)
    assert remembered.cache_info().currsize >= 1
    forget_remembered_texts(tokenizer)
    fresh = _plain_encoder(tokenizer)
    assert fresh is not remembered and fresh.cache_info().currsize == 0
    assert plain_tokens(tokenizer, text) == list(remembered(text))
    forget_remembered_texts(tokenizer)
    forget_remembered_texts(tokenizer)
    assert _plain_encoder(tokenizer).cache_info().currsize == 0

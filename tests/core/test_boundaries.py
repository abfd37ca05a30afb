"""Every budget of a rollout at its exact edge: what is exactly as long as a budget allows fits,
one token more does not. The expected values come from the rules themselves, never from the
code under test: a next prompt is the chat template's full render of the conversation (one token
must stay free to generate), a content is as long as the tokenizer says, a cut is the longest
token prefix (plus the marker) that fits, a token id must be below the vocabulary size."""

from __future__ import annotations

import pytest

from searchr1.core.datum import build_training_datums, drop_out_of_vocab
from searchr1.core.observation.fit import fit_tool_content, truncate_to_fit
from searchr1.core.observation.text import NO_RESULTS_TEXT
from searchr1.core.protocol import SEARCH_TOOL
from searchr1.core.rollout import PendingCall, RolloutConfig, make_request, record_turn
from searchr1.core.tools import shown_call
from searchr1.core.types import SearchExample, SearchItem, SearchResult, Termination, Trajectory, Turn

CALL = "<tool_call>\n<function=search>\n<parameter=query>\nSeine\n</parameter>\n</function>\n</tool_call>"
MESSAGES = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": "Which river?"}]
EXAMPLE = SearchExample("q", "Which river?", ("Seine",), "nq")
MARKER = " [... truncated to fit the budget]"
FIRST = SearchItem("Seine", "The Seine flows through Paris, a city of many bridges and quays.", "Wikipedia")
SECOND = SearchItem("Loire", "The Loire is the longest river of France.", "Wikipedia")
# the lab port's layout of an item with a source and no url, numbered from 1; items joined by a blank line
ONE = f"[1] Title: {FIRST.title}\n    Content: {FIRST.content}\n    Source: {FIRST.source}"
TWO = ONE + f"\n\n[2] Title: {SECOND.title}\n    Content: {SECOND.content}\n    Source: {SECOND.source}"
MODES = ("truncate", "end")


def rendered(tokenizer, messages, generate: bool = True) -> list[int]:
    """The chat template's own tokens of a conversation (the search tool declared, thinking off)."""
    return list(tokenizer.apply_chat_template(messages, tools=[SEARCH_TOOL], tokenize=True,
                                              add_generation_prompt=generate, enable_thinking=False,
                                              return_dict=False))


def with_observation(content: str) -> list[dict]:
    return MESSAGES + [{"role": "assistant", "content": CALL},
                       {"role": "tool", "tool_call_id": "c1", "name": "search", "content": content}]


def next_prompt(tokenizer, content: str) -> list[int]:
    """The next prompt by the rule: the whole conversation with the observation, rendered."""
    return rendered(tokenizer, with_observation(content))


def tool_turn(tokenizer) -> tuple[list[int], list[int]]:
    """The first prompt, and a completion that calls search as a sampler returns it (stop token last)."""
    return rendered(tokenizer, MESSAGES), tokenizer.encode(CALL, add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")]


def fit(tokenizer, items, **budgets):
    prompt, completion = tool_turn(tokenizer)
    return fit_tool_content(tokenizer, MESSAGES, CALL, prompt, completion, "c1", SearchResult(True, tuple(items)),
                            RolloutConfig(**budgets))


def size(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def cuts(tokenizer, text: str) -> list[str]:
    """Every cut of ``text`` by the rule, longest first: its first k tokens, decoded, without a half
    character or trailing space, plus the marker (a cut with nothing left is none)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    heads = [tokenizer.decode(ids[:k]).rstrip("\ufffd") for k in range(len(ids), 0, -1)]
    return [head.rstrip() + MARKER for head in heads if head.strip()]


# ---------------------------------------------------------------- the room left in the trajectory


def test_the_rule_for_the_next_prompt_is_the_full_render(tokenizer):
    """The oracle the tests below stand on: a fitted observation's next prompt is the template's
    render of the whole conversation."""
    fitted = fit(tokenizer, [FIRST])
    assert fitted is not None and fitted.content == ONE and fitted.next_prompt == next_prompt(tokenizer, ONE)


@pytest.mark.parametrize("ending", ["", "<|im_end|>", "<|im_end|>\n"])
def test_the_next_prompt_adds_exactly_the_part_of_the_closing_the_sampler_did_not_return(tokenizer, ending):
    """Whatever part of the template's closing of a reply (``<|im_end|>`` and a newline) the
    completion already ends with, the next prompt is the full render: none of it twice, none missing."""
    prompt = rendered(tokenizer, MESSAGES)
    completion = tokenizer.encode(CALL + ending, add_special_tokens=False)
    fitted = fit_tool_content(tokenizer, MESSAGES, CALL, prompt, completion, "c1", SearchResult(True, (FIRST,)),
                              RolloutConfig())
    assert fitted is not None and fitted.next_prompt == next_prompt(tokenizer, ONE)


@pytest.mark.parametrize("before", [[], [FIRST]])
def test_an_observation_ending_in_spaces_is_sized_as_the_template_trims_it(tokenizer, before):
    """The template trims the tool message: a content whose last item ends in spaces and newlines
    fits a budget of exactly its trimmed render + 1."""
    spaced = SearchItem("Seine", "The Seine flows through Paris. \n\n ", None, None)  # evidence layout
    content = "\n\n".join([ONE] * len(before) + [f"[{len(before) + 1}] Source: Seine\n    Evidence: {spaced.content}"])
    budget = len(next_prompt(tokenizer, content)) + 1
    fitted = fit(tokenizer, before + [spaced], max_trajectory_tokens=budget)
    assert fitted is not None and (fitted.content, fitted.truncated) == (content, False)
    assert fitted.next_prompt == next_prompt(tokenizer, content)


@pytest.mark.parametrize("mode", MODES)
def test_an_observation_as_long_as_the_room_fits_and_one_token_longer_does_not(tokenizer, mode):
    """One item: a trajectory budget of exactly the next prompt + 1 takes it whole; one token less
    ends the trajectory (``end``) or cuts it (``truncate``), the cut within the room."""
    budget = len(next_prompt(tokenizer, ONE)) + 1
    exact = fit(tokenizer, [FIRST], max_trajectory_tokens=budget, tool_overflow=mode)
    assert exact is not None and (exact.content, exact.truncated) == (ONE, False)
    assert exact.next_prompt == next_prompt(tokenizer, ONE)
    over = fit(tokenizer, [FIRST], max_trajectory_tokens=budget - 1, tool_overflow=mode)
    if mode == "end":
        assert over is None
    else:
        assert over is not None and over.truncated and over.content.endswith(MARKER)
        assert len(over.next_prompt) + 1 <= budget - 1


@pytest.mark.parametrize("mode", MODES)
def test_whole_items_are_taken_while_they_fit_exactly(tokenizer, mode):
    """Two items: a budget of exactly their next prompt + 1 takes both; one token less takes the
    first alone, whole."""
    budget = len(next_prompt(tokenizer, TWO)) + 1
    both = fit(tokenizer, [FIRST, SECOND], max_trajectory_tokens=budget, tool_overflow=mode)
    assert both is not None and (both.content, both.truncated) == (TWO, False)
    first = fit(tokenizer, [FIRST, SECOND], max_trajectory_tokens=budget - 1, tool_overflow=mode)
    assert first is not None and (first.content, first.truncated) == (ONE, False)


def test_a_result_is_a_search_results_unless_another_tool_is_named(tokenizer):
    """Without a tool named, the observation of a failed call or of no items reads as search's."""
    prompt, completion = tool_turn(tokenizer)
    config = RolloutConfig()
    failed = fit_tool_content(tokenizer, MESSAGES, CALL, prompt, completion, "c1",
                              SearchResult(False, error="HTTP 503"), config)
    empty = fit_tool_content(tokenizer, MESSAGES, CALL, prompt, completion, "c1", SearchResult(True, ()), config)
    assert failed is not None and failed.content == "Search error: HTTP 503"
    assert empty is not None and empty.content == NO_RESULTS_TEXT


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_a_cut_observation_is_the_longest_cut_that_fills_the_room(tokenizer, keep):
    """The item is shorter than 64 tokens, so every cut is tried, longest first: at a budget of
    exactly some cut's next prompt + 1 the result is the longest cut whose render fits, and one
    token less gives a shorter one (``keep``: where the cut lies among those shorter than the
    whole item)."""
    every = cuts(tokenizer, ONE)
    assert size(tokenizer, ONE) < 64
    lengths = {cut: len(next_prompt(tokenizer, cut)) for cut in every}
    shorter = [cut for cut in every if lengths[cut] < len(next_prompt(tokenizer, ONE))]
    target = shorter[int((len(shorter) - 1) * (1 - keep))]

    def longest_within(budget: int) -> str:
        return next(cut for cut in every if lengths[cut] + 1 <= budget)

    budget = lengths[target] + 1
    for room in (budget, budget - 1):
        fitted = fit(tokenizer, [FIRST], max_trajectory_tokens=room)
        assert fitted is not None and fitted.truncated
        assert fitted.content == longest_within(room)
        assert fitted.next_prompt == next_prompt(tokenizer, fitted.content)
    assert longest_within(budget - 1) != longest_within(budget) == target


def test_no_observation_fits_when_not_even_the_shortest_cut_does(tokenizer):
    shortest = min(len(next_prompt(tokenizer, cut)) for cut in cuts(tokenizer, ONE))
    assert fit(tokenizer, [FIRST], max_trajectory_tokens=shortest) is None
    assert fit(tokenizer, [FIRST], max_trajectory_tokens=shortest + 1) is not None


# ---------------------------------------------------------------- the cut itself


def test_a_cut_starts_from_the_whole_text(tokenizer):
    """With a limit of the text's own length and a budget that takes anything, the cut keeps every
    token (it starts at the whole text, not one token short); at one token less it drops the last."""
    ids = tokenizer.encode(ONE, add_special_tokens=False)
    assert truncate_to_fit(tokenizer, ONE, lambda _: True, len(ids)) == ONE + MARKER
    assert truncate_to_fit(tokenizer, ONE, lambda _: True, len(ids) + 1) == ONE + MARKER
    assert truncate_to_fit(tokenizer, ONE, lambda _: True, len(ids) - 1) == tokenizer.decode(ids[:-1]).rstrip() + MARKER


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.75])
def test_a_cut_within_a_token_budget_is_the_longest_within_it(tokenizer, keep):
    every = cuts(tokenizer, ONE)
    target = every[int(len(every) * (1 - keep))]
    budget = size(tokenizer, target)
    longest = next(cut for cut in every if size(tokenizer, cut) <= budget)
    assert truncate_to_fit(tokenizer, ONE, lambda c: size(tokenizer, c) <= budget, 10_000) == longest
    shorter = next(cut for cut in every if size(tokenizer, cut) <= budget - 1)
    assert truncate_to_fit(tokenizer, ONE, lambda c: size(tokenizer, c) <= budget - 1, 10_000) == shorter != longest


def test_a_cut_never_ends_in_part_of_a_character(tokenizer):
    """Byte-level tokens split a CJK character or an emoji: a cut that ends inside one drops the
    partial character instead of keeping a replacement character, and is the longest that fits."""
    text = "饕餮X🙂🙃 naïve 鳥X"  # an X: only the replacement character is stripped
    ids = tokenizer.encode(text, add_special_tokens=False)
    for budget in range(1, len(ids) + 12):
        cut = truncate_to_fit(tokenizer, text, lambda c: size(tokenizer, c) <= budget, 10_000)
        if cut is None:
            continue
        assert "\ufffd" not in cut and text.startswith(cut[:-len(MARKER)])
        whole = [tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]
        fitting = [h.rstrip() for h in whole if "\ufffd" not in h and h.strip()
                   and size(tokenizer, h.rstrip() + MARKER) <= budget]
        assert cut == max(fitting, key=len) + MARKER


def test_a_long_cut_steps_down_an_eighth_at_a_time_until_64_tokens_remain(tokenizer):
    """The prefixes tried, longest first: the limit (or the whole text), then an eighth fewer
    tokens each time while more than 64 remain, then one token at a time."""
    text = "river" + " river" * 199  # 200 tokens, each word one token
    assert len(tokenizer.encode(text, add_special_tokens=False)) == 200
    for limit in (500, 200, 150, 65, 64, 10):
        tried = []

        def refuse(candidate):
            tried.append(candidate[:-len(MARKER)].count("river"))
            return False

        assert truncate_to_fit(tokenizer, text, refuse, limit) is None
        expected, keep = [], min(200, limit)
        while keep > 0:
            expected.append(keep)
            keep -= keep // 8 if keep > 64 else 1
        assert tried == expected


# ---------------------------------------------------------------- the content cap


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_the_content_cap_takes_whole_items_up_to_exactly_its_size(tokenizer, mode, offset):
    """max_tool_response_tokens counts the content's own tokens: at the two items' size or one more
    both are taken, at one less only the first."""
    cap = size(tokenizer, TWO) + offset
    fitted = fit(tokenizer, [FIRST, SECOND], max_tool_response_tokens=cap, tool_overflow=mode)
    assert fitted is not None and (fitted.content, fitted.truncated) == (TWO if offset >= 0 else ONE, False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_the_content_cap_on_a_single_item(tokenizer, mode, offset):
    """At the item's size or one more it is taken whole; at one less it is cut within the cap
    (``truncate``) or the trajectory ends (``end``)."""
    cap = size(tokenizer, ONE) + offset
    fitted = fit(tokenizer, [FIRST], max_tool_response_tokens=cap, tool_overflow=mode)
    if offset >= 0:
        assert fitted is not None and (fitted.content, fitted.truncated) == (ONE, False)
    elif mode == "end":
        assert fitted is None
    else:
        assert fitted is not None and fitted.truncated
        assert fitted.content == next(cut for cut in cuts(tokenizer, ONE) if size(tokenizer, cut) <= cap)


# ---------------------------------------------------------------- sampling, turns, searches


def trajectory() -> Trajectory:
    return Trajectory(EXAMPLE, 0, 0, [dict(m) for m in MESSAGES])


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_a_request_asks_for_exactly_the_tokens_left(tokenizer, offset):
    """At a trajectory budget of the prompt's length nothing can be sampled (the prompt alone is
    too long); each token more is one more to sample."""
    prompt = len(rendered(tokenizer, MESSAGES))
    t = trajectory()
    request = make_request(tokenizer, [t], 7, RolloutConfig(max_trajectory_tokens=prompt + offset))
    if offset == 0:
        assert request is None and t.termination == Termination.PROMPT_TOO_LONG
    else:
        assert request is not None and request.max_tokens == offset
    capped = make_request(tokenizer, [trajectory()], 7,
                          RolloutConfig(max_trajectory_tokens=prompt + 2, max_assistant_tokens=offset + 1))
    assert capped is not None and capped.max_tokens == min(offset + 1, 2)


def consumed(tokenizer, **budgets) -> tuple[Trajectory, PendingCall | None]:
    prompt, completion = tool_turn(tokenizer)
    t = trajectory()
    turn = Turn(prompt, completion, [-0.5] * len(completion), CALL)
    return t, record_turn(t, turn, tokenizer, RolloutConfig(**budgets))


def test_a_search_is_made_only_when_a_one_letter_observation_fits_exactly(tokenizer):
    """Before searching: the budget must hold the next prompt with a one-letter observation and one
    token to generate."""
    budget = len(next_prompt(tokenizer, "x")) + 1
    t, pending = consumed(tokenizer, max_trajectory_tokens=budget)
    assert pending is not None and shown_call(pending.calls[0]) == "Seine" and t.termination is None
    t, pending = consumed(tokenizer, max_trajectory_tokens=budget - 1)
    assert pending is None and t.termination == Termination.TOKEN_BUDGET


@pytest.mark.parametrize("turns", [1, 2])
def test_a_tool_call_on_the_last_allowed_turn_ends_the_trajectory(tokenizer, turns):
    t, pending = consumed(tokenizer, max_assistant_turns=turns)
    assert (pending is None, t.termination) == ((True, Termination.TURN_BUDGET) if turns == 1 else (False, None))


@pytest.mark.parametrize("searches", [0, 1])
def test_a_tool_call_with_no_search_left_ends_the_trajectory(tokenizer, searches):
    t, pending = consumed(tokenizer, max_search_calls=searches)
    assert (pending is None, t.termination) == ((True, Termination.SEARCH_BUDGET) if searches == 0 else (False, None))


# ---------------------------------------------------------------- the vocabulary


@pytest.mark.parametrize("where", ["input", "target"])
@pytest.mark.parametrize("offset", [-1, 0])
def test_a_datum_with_a_token_id_of_the_vocabulary_size_is_dropped_and_one_below_kept(tokenizer, where, offset):
    """Token ids run from 0 to len(tokenizer) - 1: an id equal to the size is outside, whether it
    is only in the model input (the first token) or only in the targets (the last)."""
    vocab = len(tokenizer)
    token = vocab + offset
    prompt, completion = ([token, 5, 6], [7, 8]) if where == "input" else ([4, 5, 6], [7, token])
    t = trajectory()
    t.turns.append(Turn(prompt, completion, [-0.5, -0.5], "Answer: Seine"))
    t.finish(Termination.ANSWER, "Answer: Seine")
    t.credit(0.5)
    datums = build_training_datums([t])
    assert len(datums) == 1
    kept, dropped = drop_out_of_vocab(datums, vocab)
    assert (len(kept), dropped) == ((1, 0) if offset == -1 else (0, 1))

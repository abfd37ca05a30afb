"""Thinking mode (``--thinking``) with the real Qwen3.5 tokenizer and chat template: the generation
prompt opens ``<think>``, a turn's reasoning comes first and is kept as sampled, calls and the answer
are read only after ``</think>``, and the stitched sequence is what a full render of the
conversation gives (the template shows every turn after the question with its reasoning)."""

from __future__ import annotations

import re
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.core.protocol import (
    THINK_CLOSE,
    TurnKind,
    assistant_message,
    build_next_prompt,
    build_prompt,
    initial_messages,
    observation_tokens,
    parse_assistant,
    render_text,
    split_reasoning,
    template_boundaries,
    tool_message,
)

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"

plain_text = st.text(
    alphabet=string.ascii_letters + string.digits + " .,;:!?'\"-()\n" + "éüßçøπЖ中文日本語😀",
    min_size=1,
    max_size=60,
).map(str.strip).filter(bool)
# Reasoning as a model may write it: with blank lines, and spaces or newlines the template trims.
padded_text = st.tuples(st.sampled_from(["", "\n", " ", "\n\n", " \n"]), plain_text,
                        st.sampled_from(["", "\n", "  ", "\n\n", "\t"])).map("".join)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def sampled(reasoning: str, said: str) -> str:
    """A thinking turn as the model writes it after the prompt's open ``<think>``."""
    return f"{reasoning}\n{THINK_CLOSE}\n\n{said}"


def test_the_thinking_generation_prompt_opens_the_reasoning(tokenizer):
    messages = initial_messages("Which river flows through Paris?")
    assert render_text(tokenizer, messages, True, thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    assert render_text(tokenizer, messages, True).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the observation ends with the next generation prompt, so it is learnt for each mode; the closing is one
    on, off = template_boundaries(tokenizer, thinking=True), template_boundaries(tokenizer)
    assert on.closing == off.closing and on.observation_prefix == off.observation_prefix
    assert on.observation_suffix.endswith("<think>\n") and off.observation_suffix.endswith("</think>\n\n")
    assert observation_tokens(tokenizer, "x", thinking=True) != observation_tokens(tokenizer, "x")


@SETTINGS
@given(plain_text, plain_text, plain_text)
def test_calls_and_answers_count_only_after_the_reasoning(reasoning, query, answer):
    query = query.replace("<", "").replace(">", "") or "q"
    decoy = f"{reasoning}\n{CALL.format('decoy')}\nAnswer: {answer}"
    turn = parse_assistant(sampled(decoy, CALL.format(query)), thinking=True)
    assert turn.kind == TurnKind.TOOL and turn.reasoning == decoy + "\n" and turn.query == query.strip()
    closed = parse_assistant(sampled(decoy, f"Answer: {answer}") + "<|im_end|>", thinking=True)
    assert closed.kind == TurnKind.ANSWER and closed.text.strip() == f"Answer: {answer}"
    # reasoning that never closes says nothing: no call runs, no answer scores
    unclosed = parse_assistant(decoy, thinking=True)
    assert unclosed.kind == TurnKind.ANSWER and unclosed.text == "" and unclosed.reasoning == decoy
    # thinking off, the same text is read whole, as before: a call with text after it
    assert parse_assistant(decoy).reasoning is None and parse_assistant(decoy).kind == TurnKind.INVALID


@SETTINGS
@given(st.text(max_size=80))
def test_split_reasoning_loses_no_text(text):
    reasoning, rest = split_reasoning(text)
    assert (reasoning + THINK_CLOSE + rest == text) if THINK_CLOSE in text else (reasoning, rest) == (text, "")


@st.composite
def thinking_conversations(draw, reasoning=plain_text):
    turns = []
    for _ in range(draw(st.integers(1, 4))):
        query = draw(plain_text.filter(lambda s: "<" not in s and ">" not in s))
        observation = draw(st.one_of(plain_text, st.just("Search returned no results.")))
        turns.append((draw(reasoning), CALL.format(query), observation, draw(st.integers(0, 2))))
    return draw(plain_text), turns


def _stitch(tokenizer, question, turns):
    """Each turn sampled as ``sampled()`` writes it, stitched; yields the sequence before and after
    each turn and the conversation as messages."""
    closing = list(template_boundaries(tokenizer).closing)
    messages = initial_messages(question, max_search_calls=5)
    tokens = build_prompt(tokenizer, messages, thinking=True)
    for index, (reasoning, said, observation, closing_part) in enumerate(turns, start=1):
        completion = tokenizer.encode(sampled(reasoning, said), add_special_tokens=False) + closing[:closing_part]
        parsed = parse_assistant(tokenizer.decode(completion), thinking=True)
        assistant = assistant_message(parsed.text, parsed.reasoning)
        tool = tool_message(f"search-0-0-{index}", observation)
        stitched = build_next_prompt(tokenizer, messages, assistant, tokens, completion, tool, thinking=True)
        messages = messages + [assistant, tool]
        yield tokens, completion, stitched, messages
        tokens = stitched


@SETTINGS
@given(thinking_conversations())
def test_stitched_thinking_prompt_equals_full_render_with_the_reasoning_kept(tokenizer, convo):
    for before, completion, stitched, messages in _stitch(tokenizer, *convo):
        assert stitched[: len(before) + len(completion)] == before + completion  # the sampled tokens, as sampled
        assert stitched == build_prompt(tokenizer, messages, thinking=True)


def _reasoning_blocks_trimmed(text: str) -> str:
    return re.sub(r"<think>\s*(.*?)\s*</think>\s*", r"<think>\1</think>", text, flags=re.DOTALL)


@SETTINGS
@given(thinking_conversations(reasoning=padded_text))
def test_whitespace_the_template_trims_stays_as_sampled_and_is_all_that_differs(tokenizer, convo):
    """The template trims a reasoning's outer whitespace when it renders the turn again; the
    sequence trained on keeps the sampled tokens, and differs from the full render by that
    whitespace and nothing else (the drift check passes: no earlier turn is rewritten)."""
    for before, completion, stitched, messages in _stitch(tokenizer, *convo):
        assert stitched[: len(before) + len(completion)] == before + completion
        full = render_text(tokenizer, messages, True, thinking=True)
        ours = tokenizer.decode(stitched, skip_special_tokens=False)
        assert _reasoning_blocks_trimmed(ours) == _reasoning_blocks_trimmed(full)

"""Tool protocol: parsing rules, rendering shapes, and token stitching against the real
Qwen3.5 template."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import unicodedata

from searchr1.runtime.preflight import check_template
from searchr1.core.observation.text import error_text
from searchr1.core.rollout import RolloutConfig, effective_system_prompt
from searchr1.core.tools import search_spec
from searchr1.core.types import SearchResult
from searchr1.core.protocol import (
    SEARCH_TOOL,
    TemplateDriftError,
    assistant_message,
    build_next_prompt,
    build_prompt,
    initial_messages,
    observation_joint,
    observation_tokens,
    parse_assistant,
    render,
    stop_sequences,
    system_prompt,
    template_boundaries,
    tool_message,
)

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{q}\n</parameter>\n</function>\n</tool_call>"


def call(query: str, before: str = "") -> str:
    text = CALL.format(q=query)
    return f"{before}\n\n{text}" if before else text


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, kind, query, content",
    [
        (call("Eiffel Tower height"), "tool", "Eiffel Tower height", ""),
        (call("  padded query \n"), "tool", "padded query", ""),
        (call("line one\nline two"), "tool", "line one\nline two", ""),
        (call("x", before="Let me check."), "tool", "x", "Let me check."),
        (call("x") + "<|im_end|>", "tool", "x", ""),
        (call("x") + "\n  \n", "tool", "x", ""),
        ("Answer: Paris\n\n" + call("x"), "tool", "x", "Answer: Paris"),
        ("<tool_call><function=search><parameter=query>compact</parameter></function></tool_call>", "tool", "compact", ""),
        ('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>', "invalid", None, None),
        (CALL.format(q="x").replace("function=search", "function=web_search"), "invalid", None, None),
        (
            "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n"
            "<parameter=k>\n3\n</parameter>\n</function>\n</tool_call>",
            "invalid", None, None,
        ),
        (call("a") + "\n" + call("b"), "invalid", None, None),
        (call("a") + "\nAnswer: b", "invalid", None, None),
        ("<tool_call>\n<function=search>\n<parameter=query>\nunclosed", "invalid", None, None),
        (call("   "), "invalid", None, None),
        (call("a < b"), "invalid", None, None),
        (call("a > b"), "invalid", None, None),
        ('<tool_call>{"name":"search"}</tool_call>\n' + call("x"), "invalid", None, None),
        ("Answer: Paris", "answer", None, "Answer: Paris"),
        ("", "answer", None, ""),
        ("no answer line at all", "answer", None, "no answer line at all"),
        ("Answer: Paris<|im_end|>", "answer", None, "Answer: Paris"),
    ],
)
def test_parse_assistant_lab_port_rules(text, kind, query, content):
    parsed = parse_assistant(text)
    assert parsed.kind == kind
    assert parsed.query == query
    if content is not None:  # the planning text before a call, or the whole answer
        before_call = parsed.text.split("<tool_call>")[0] if parsed.kind == "tool" else parsed.text
        assert before_call.strip() == content


tag_soup = st.lists(
    st.sampled_from(
        ["<tool_call>", "</tool_call>", "<function=search>", "</function>", "<parameter=query>",
         "</parameter>", "<|im_end|>", "\n", " ", "x", "<", ">", "Answer:", "{", "}"]
    )
    | st.text(max_size=8),
    max_size=20,
).map("".join)


@given(st.one_of(st.text(), tag_soup))
def test_parse_assistant_never_raises_and_returns_one_of_three_kinds(text):
    parsed = parse_assistant(text)
    assert parsed.kind in ("tool", "answer", "invalid")
    assert (parsed.query is not None) == (parsed.kind == "tool")


@given(st.text().filter(lambda s: "<tool_call>" not in s))
def test_text_without_a_tool_call_is_an_answer(text):
    assert parse_assistant(text).kind == "answer"


queries = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="<>", exclude_categories=("Cs",)),
    min_size=1,
    max_size=200,
).filter(lambda q: q.strip())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries)
def test_rendered_search_call_round_trips_through_the_parser(tokenizer, query):
    """Any non-empty query without < or > survives the official template and the tokenizer,
    modulo the parser's strip (and the tokenizer's NFC normalisation)."""
    messages = initial_messages("q?") + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": query}}}]}
    ]
    prompt = build_prompt(tokenizer, initial_messages("q?"))
    full = render(tokenizer, messages, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt
    generated = tokenizer.decode(full[len(prompt):], skip_special_tokens=False)
    parsed = parse_assistant(generated)
    assert parsed.kind == "tool"
    assert parsed.query == unicodedata.normalize("NFC", query).strip()


# ----------------------------------------------------------------------------- rendering


def test_render_returns_a_plain_list_of_ints(tokenizer):
    tokens = render(tokenizer, initial_messages("Who wrote Hamlet?"), add_generation_prompt=True)
    assert isinstance(tokens, list) and all(type(t) is int for t in tokens)
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert '"name": "search"' in text and "<IMPORTANT>" in text


@settings(max_examples=25, deadline=None)
@given(question=st.text(max_size=40), answer=st.text(max_size=40), generate=st.booleans())
def test_render_gives_the_tokens_the_template_gives(tokenizer, question, answer, generate):
    """The tokens of a render are those of ``apply_chat_template(tokenize=True)`` itself, for any
    conversation (the render encodes the template's text without adding special tokens)."""
    messages = initial_messages(question) + [assistant_message(answer)]
    direct = tokenizer.apply_chat_template(messages, tools=[SEARCH_TOOL], tokenize=True, add_generation_prompt=generate,
                                           enable_thinking=False, return_dict=False)
    assert render(tokenizer, messages, add_generation_prompt=generate) == [int(t) for t in direct]


def test_stop_sequences_is_the_eos_string(tokenizer):
    assert stop_sequences(tokenizer) == ["<|im_end|>"]


def test_system_prompt_states_the_search_budget_when_given():
    assert "at most 4 times" in system_prompt(4)
    assert "times in total" not in system_prompt(None)
    assert initial_messages("Q?", max_search_calls=2)[0]["content"] == system_prompt(2)
    assert initial_messages("Q?")[1] == {"role": "user", "content": "Q?"}


@pytest.mark.parametrize("calls", [1, 2, 5])
@pytest.mark.parametrize("budget", [None, 3])
def test_a_rollouts_system_prompt_tells_the_calls_a_turn_may_make_and_the_budget(calls, budget):
    config = RolloutConfig(group_size=1, max_calls_per_turn=calls, max_search_calls=budget or 4,
                           state_search_budget=budget is not None)
    prompt = effective_system_prompt(config)
    assert ("at most one tool call in a turn" in prompt) == (calls == 1)
    assert (f"at most {calls} tool calls in a turn" in prompt) == (calls > 1)
    assert ("at most 3 times" in prompt) == (budget == 3)


def test_the_search_tool_shows_the_description_it_is_given_and_the_default_without_one():
    assert search_spec("Look it up in the encyclopedia.").schema()["function"]["description"] == \
        "Look it up in the encyclopedia."
    assert search_spec().schema() == SEARCH_TOOL and SEARCH_TOOL["function"]["description"].strip()


def test_a_tool_message_is_searchs_unless_another_tool_is_named():
    assert tool_message("c1", "Paris") == {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "Paris"}
    assert tool_message("c2", "page", "open_page")["name"] == "open_page"


def test_an_error_is_a_search_error_unless_another_tool_is_named():
    failed = SearchResult(ok=False, error="timed out")
    assert error_text(failed) == error_text(failed, "search") == "Search error: timed out"
    assert error_text(failed, "open_page") == "Tool error (open_page): timed out"
    assert error_text(failed, "") == "Tool error: timed out"


def test_search_tool_has_one_required_string_query():
    params = SEARCH_TOOL["function"]["parameters"]
    assert SEARCH_TOOL["function"]["name"] == "search"
    assert params["required"] == ["query"] and params["properties"]["query"]["type"] == "string"


# ----------------------------------------------------------------------------- stitching


def test_boundaries_are_the_qwen35_closing_and_tool_turn(tokenizer):
    b = template_boundaries(tokenizer)
    assert b.closing == (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.encode("\n")[0])
    assert b.observation_prefix == "<|im_start|>user\n<tool_response>\n"
    assert b.observation_suffix.startswith("\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


plain_text = st.text(
    alphabet=string.ascii_letters + string.digits + " .,;:!?'\"-()\n" + "éüßçøπЖ中文日本語😀",
    min_size=1,
    max_size=60,
).map(str.strip).filter(bool)


@st.composite
def conversations(draw):
    turns = []
    for _ in range(draw(st.integers(1, 5))):
        planning = draw(st.one_of(st.just(""), plain_text))
        query = draw(plain_text.filter(lambda s: "<" not in s and ">" not in s))
        observation = draw(st.one_of(plain_text, st.just("Search returned no results.")))
        closing_part = draw(st.integers(0, 2))
        turns.append((call(query, planning), observation, closing_part))
    return draw(plain_text), turns


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations())
def test_stitched_prompt_equals_full_render_whatever_part_of_the_closing_was_sampled(tokenizer, convo):
    question, turns = convo
    closing = list(template_boundaries(tokenizer).closing)
    messages = initial_messages(question, max_search_calls=5)
    tokens = build_prompt(tokenizer, messages)
    for index, (text, observation, closing_part) in enumerate(turns, start=1):
        completion = tokenizer.encode(text, add_special_tokens=False) + closing[:closing_part]
        tool = tool_message(f"search-0-0-{index}", observation)
        stitched = build_next_prompt(tokenizer, messages, text, tokens, completion, tool)
        assert stitched[: len(tokens) + len(completion)] == tokens + completion
        messages = messages + [assistant_message(text), tool]
        assert stitched == build_prompt(tokenizer, messages)
        tokens = stitched


def test_build_next_prompt_renders_the_template_twice(tokenizer):
    messages = initial_messages("Q?")
    prompt = build_prompt(tokenizer, messages)
    text = call("q")
    template_boundaries(tokenizer)
    renders = []
    original = tokenizer.apply_chat_template
    tokenizer.apply_chat_template = lambda *a, **k: renders.append(1) or original(*a, **k)
    try:
        build_next_prompt(tokenizer, messages, text, prompt, tokenizer.encode(text), tool_message("c", "obs"))
    finally:
        del tokenizer.apply_chat_template
    assert len(renders) == 2


def test_observation_tokens_match_the_template_delta(tokenizer):
    messages = initial_messages("Q?") + [assistant_message(call("q"))]
    content = "  [1] Title: X.\n    Content: ends with punctuation.  "
    end = render(tokenizer, messages, add_generation_prompt=False)
    nxt = render(tokenizer, messages + [tool_message("c", content)], add_generation_prompt=True)
    assert nxt[len(end):] == observation_tokens(tokenizer, content)


class _TemplateSwap:
    """The real tokenizer with another chat template."""

    def __init__(self, tokenizer, template):
        self._tokenizer = tokenizer
        self.chat_template = template

    def apply_chat_template(self, *args, **kwargs):
        return self._tokenizer.apply_chat_template(*args, chat_template=self.chat_template, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_a_template_that_rewrites_history_is_detected(tokenizer):
    # Qwen3-style: the think block is kept only on the very last message, so an assistant turn
    # followed by a tool message renders differently from the same turn at the end.
    original = "{%- if loop.index0 > ns.last_query_index %}"
    assert original in tokenizer.chat_template
    drifting = _TemplateSwap(tokenizer, tokenizer.chat_template.replace(original, "{%- if loop.last %}"))
    with pytest.raises(TemplateDriftError, match="^adding a tool observation rewrote the rendered conversation "
                                                 "before it$"):
        check_template(drifting)
    messages = initial_messages("Q?")
    text = call("q")
    with pytest.raises(TemplateDriftError, match=r"^the chat template rewrote earlier history after the tool "
                                                 r"observation was added \(the render with the tool message does "
                                                 r"not extend the render without it\)$"):
        build_next_prompt(
            drifting, messages, text, build_prompt(drifting, messages), drifting.encode(text),
            tool_message("c", "obs"),
        )


def test_template_drift_error_is_a_value_error():
    assert issubclass(TemplateDriftError, ValueError)


def test_a_template_without_an_empty_think_block_fails_the_startup_check(tokenizer):
    broken = _TemplateSwap(
        tokenizer, tokenizer.chat_template.replace("'<think>\\n\\n</think>\\n\\n'", "'<think>\\n'")
    )
    assert broken.chat_template != tokenizer.chat_template
    with pytest.raises(TemplateDriftError, match="empty think block"):
        check_template(broken)


def test_check_template_passes_on_the_official_template(tokenizer):
    assert check_template(tokenizer).closing == template_boundaries(tokenizer).closing


@pytest.mark.parametrize("text, as_text", [(None, ""), (42, "42"), (b"x", "b'x'")])
def test_a_turn_that_is_not_text_is_read_as_its_text(text, as_text):
    assert parse_assistant(text) == parse_assistant(as_text)


def test_a_call_closed_twice_is_invalid():
    assert parse_assistant(call("paris")).kind == "tool"
    assert parse_assistant(call("paris") + "</tool_call>").kind == "invalid"
    assert parse_assistant("<tool_call>" + call("paris")).kind == "invalid"


def test_a_template_changed_in_place_is_learnt_again(tokenizer):
    """``--chat-template`` swaps the template of the tokenizer the run holds: the boundaries
    learnt from the old one must not stand in for the new one's."""
    swap = _TemplateSwap(tokenizer, tokenizer.chat_template)
    before = template_boundaries(swap)
    assert observation_tokens(swap, "Paris") == observation_tokens(tokenizer, "Paris")  # the old wrapper, cached
    wider = "{{- '\\n<tool_response>\\n\\n' }}"
    assert "{{- '\\n<tool_response>\\n' }}" in tokenizer.chat_template
    swap.chat_template = tokenizer.chat_template.replace("{{- '\\n<tool_response>\\n' }}", wider)
    after = template_boundaries(swap)
    assert after.observation_prefix == before.observation_prefix + "\n"
    fresh = _TemplateSwap(tokenizer, swap.chat_template)
    assert after == template_boundaries(fresh)
    assert observation_tokens(swap, "Paris") == observation_tokens(fresh, "Paris")  # the wrapper too


OPENING, CLOSING = "{{- '\\n<tool_response>\\n' }}", "{{- '\\n</tool_response>' }}"  # the template's tool response


def test_the_joint_of_two_responses_is_learnt_again_when_the_template_changes_in_place(tokenizer):
    """Qwen3.5 puts ``\\n</tool_response>\\n<tool_response>\\n`` between two tool responses of one
    turn; a template that opens a response after another with one more newline has that joint,
    though the tokenizer learnt the old one first."""
    assert OPENING in tokenizer.chat_template and CLOSING in tokenizer.chat_template
    swap = _TemplateSwap(tokenizer, tokenizer.chat_template)
    assert observation_joint(swap) == "\n</tool_response>\n<tool_response>\n"
    swap.chat_template = tokenizer.chat_template.replace(OPENING, (
        "{%- if loop.previtem.role == 'tool' %}{{- '\\n\\n<tool_response>\\n' }}"
        "{%- else %}{{- '\\n<tool_response>\\n' }}{%- endif %}"))
    assert observation_joint(swap) == "\n</tool_response>\n\n<tool_response>\n"
    assert observation_joint(_TemplateSwap(tokenizer, swap.chat_template)) == observation_joint(swap)


@pytest.mark.parametrize("changed", ["opening", "closing"])
def test_two_responses_that_are_not_one_observation_with_a_joint_are_named(tokenizer, changed):
    """Only a turn's pair is rendered otherwise (a single response still has the learnt wrapper):
    the first of two opens with a mark, or the second closes with one."""
    if changed == "opening":
        template = tokenizer.chat_template.replace(OPENING, (
            "{%- if loop.nextitem and loop.nextitem.role == 'tool' and loop.previtem.role != 'tool' %}"
            "{{- '\\n<tool_response>!\\n' }}{%- else %}{{- '\\n<tool_response>\\n' }}{%- endif %}"))
    else:
        template = tokenizer.chat_template.replace(
            CLOSING, "{{- '\\n</tool_response>' ~ ('!' if loop.last and loop.previtem.role == 'tool' else '') }}")
    swap = _TemplateSwap(tokenizer, template)
    assert template_boundaries(swap) == template_boundaries(tokenizer)  # one response: as learnt
    with pytest.raises(TemplateDriftError, match="^two tool observations are not rendered as one observation "
                                                 "with a joint$"):
        observation_joint(swap)


def _replace_one(template: str, needle: str, occurrence: int, replacement: str = "") -> str:
    """``template`` with the ``occurrence``-th (from 0) copy of ``needle`` replaced (taken out by default)."""
    start = -1
    for _ in range(occurrence + 1):
        start = template.index(needle, start + 1)
    return template[:start] + replacement + template[start + len(needle):]


def drifted(tokenizer, kind):
    """The official template broken in one way the start-up check must name."""
    template = tokenizer.chat_template
    tool_content = "{{- '\\n<tool_response>\\n' }}\n        {{- content }}"
    changes = {
        # the generation prompt gains text an assistant turn does not start with
        "generation prompt": template.replace("'<think>\\n\\n</think>\\n\\n'", "'<think>\\n\\n</think>\\n\\nX'"),
        # an assistant turn is no longer closed
        "closing": _replace_one(template, "{{- '<|im_end|>\\n' }}", 1),
        # the tool content is rendered twice
        "observation": template.replace(tool_content, tool_content + "{{- content }}"),
    }
    assert changes[kind] != template
    return _TemplateSwap(tokenizer, changes[kind])


@pytest.mark.parametrize("kind, message", [
    ("generation prompt", "cannot find the assistant closing: rendering an empty assistant turn does not extend the "
                          "generation prompt"),
    ("closing", "the template closes an assistant turn with no tokens"),
    ("observation", "the tool observation text does not appear exactly once"),
])
def test_each_way_a_template_can_break_the_boundaries_is_named_whole(tokenizer, kind, message):
    import re

    with pytest.raises(TemplateDriftError, match=f"^{re.escape(message)}$"):
        template_boundaries(drifted(tokenizer, kind))


def _conversation_dependent(tokenizer, kind):
    """The official template changed so that it passes the start-up check but renders one
    conversation's tool turn differently: the assistant turn closes otherwise when it names
    Paris, or the tool response carries its position in the conversation."""
    template = tokenizer.chat_template
    if kind == "closing":
        changed = _replace_one(template, "{{- '<|im_end|>\\n' }}", 1,
                               "{{- '<|im_end|>\\n\\n' if 'Paris' in message.content else '<|im_end|>\\n' }}")
    else:
        response = "{{- '\\n<tool_response>\\n' }}"
        changed = template.replace(response, "{{- '\\n<tool_response>' ~ (loop.index|string) ~ '\\n' }}")
    assert changed != template
    return _TemplateSwap(tokenizer, changed)


@pytest.mark.parametrize("kind, message", [
    ("closing", "the rendered assistant turn does not end with the closing tokens learnt from the template"),
    ("observation", "the template's observation differs from the wrapper learnt at start-up (the tool turn is "
                    "rendered differently for this conversation)"),
])
def test_a_tool_turn_rendered_unlike_the_start_up_probe_is_named_whole(tokenizer, kind, message):
    import re

    swapped = _conversation_dependent(tokenizer, kind)
    template_boundaries(swapped)  # the start-up check passes
    messages = initial_messages("Q?")
    if kind == "observation":  # a second search: its tool turn sits later than the probe's
        messages += [assistant_message(call("first")), tool_message("c1", "first result")]
    text = call("Paris")
    with pytest.raises(TemplateDriftError, match=f"^{re.escape(message)}$"):
        build_next_prompt(swapped, messages, text, build_prompt(swapped, messages), swapped.encode(text),
                          tool_message("c2", "obs"))

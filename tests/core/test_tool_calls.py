"""Tool calls read against declared tools: any schema the official template renders parses back
to the same typed arguments, refused calls say why, and with ``search`` alone the parser keeps
Search-R1's rules (checked against the reference loop's own parser)."""

from __future__ import annotations

import json
import math
import string
from dataclasses import replace

import pytest

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from searchr1.core.protocol import SEARCH, TurnKind, initial_messages, parse_assistant, render_text
from searchr1.core.reference_text import parse_turn as reference_parse
from searchr1.core.budgets import RolloutBudgets, declared_tools, unknown_tools
from searchr1.core.settings import SettingError
from searchr1.core.tools import DECLARED, CallError, ToolCall, ToolSpec, convert_value, parse_tool_calls, read_call

MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
TYPES = ("string", "integer", "number", "boolean", "array", "object")

names = st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=1, max_size=12).filter(
    lambda n: not n[0].isdigit())
plain_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40).filter(
    lambda s: not any(tag in s for tag in MARKUP))
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | plain_text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_text, inner, max_size=3),
    max_leaves=8,
).filter(lambda v: not any(tag in json.dumps(v, ensure_ascii=False) for tag in MARKUP))
VALUES = {
    "string": plain_text,
    "integer": st.integers(),
    "number": st.integers() | st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
    "array": st.lists(json_values, max_size=3).filter(
        lambda v: not any(tag in json.dumps(v, ensure_ascii=False) for tag in MARKUP)),
    "object": st.dictionaries(plain_text, json_values, max_size=3).filter(
        lambda v: not any(tag in json.dumps(v, ensure_ascii=False) for tag in MARKUP)),
}


@st.composite
def tools_and_calls(draw):
    """One to three declared tools, and one to three calls of them with arguments of their types."""
    tool_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    tools = []
    for name in tool_names:
        parameters = draw(st.dictionaries(names, st.sampled_from(TYPES), max_size=4))
        required = [p for p in parameters if draw(st.booleans())]
        tools.append(ToolSpec(
            name=name, description=draw(plain_text), unit="call",
            parameters={"type": "object", "properties": {p: {"type": t} for p, t in parameters.items()},
                        "required": required},
        ))
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        tool = draw(st.sampled_from(tools))
        arguments = {}
        for parameter, schema in tool.properties.items():
            if parameter in tool.required or draw(st.booleans()):
                arguments[parameter] = draw(VALUES[schema["type"]])
        calls.append(ToolCall(tool.name, arguments))
    return tools, calls


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=tools_and_calls(), planning=st.sampled_from(["", "Let me look that up."]))
def test_calls_rendered_by_the_official_template_parse_back_to_the_same_typed_arguments(tokenizer, drawn, planning):
    tools, calls = drawn
    schemas = [tool.schema() for tool in tools]
    question = initial_messages("q?")
    assistant = {"role": "assistant", "content": planning, "tool_calls": [
        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}
    prompt = render_text(tokenizer, question, add_generation_prompt=True, tools=schemas)
    full = render_text(tokenizer, question + [assistant], add_generation_prompt=False, tools=schemas)
    assert full.startswith(prompt)
    parsed = parse_assistant(full[len(prompt):], tools, max_calls=3)
    assert parsed.kind == TurnKind.TOOL, parsed.calls
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in calls]
    assert all(type(a) is type(b) or {type(a), type(b)} <= {int, float}
               for got, sent in zip(parsed.calls, calls)
               for a, b in zip(got.arguments.values(), sent.arguments.values()))


tag_soup = st.lists(
    st.sampled_from(
        ["<tool_call>", "</tool_call>", "<function=search>", "<function=other>", "</function>",
         "<parameter=query>", "<parameter=page>", "</parameter>", "<|im_end|>", "\n", " ", "x", "<", ">",
         "Answer:", "{", "}"])
    | st.text(max_size=6),
    max_size=24,
).map("".join)


SEARCH_CALL = ["<tool_call>", "\n", "<function=search>", "\n", "<parameter=query>", "\n", "QUERY", "\n",
               "</parameter>", "\n", "</function>", "\n", "</tool_call>"]
query_text = st.text(alphabet=" \nab<>", max_size=5)


@st.composite
def near_miss_calls(draw):
    """A search call with up to two of its pieces dropped or replaced, planning text before it and
    text after it."""
    changed = draw(st.sets(st.integers(0, len(SEARCH_CALL) - 1), max_size=2))
    pieces = []
    for index, piece in enumerate(SEARCH_CALL):
        if index in changed:
            pieces.append(draw(st.sampled_from(["", "<tool_call>", "</tool_call>"]) | tag_soup))
        else:
            pieces.append(draw(query_text) if piece == "QUERY" else piece)
    return draw(st.sampled_from(["", "Plan.\n\n", "</tool_call>"])) + "".join(pieces) + draw(
        st.sampled_from(["", "\n", "<|im_end|>", "x", "\n<tool_call>"]))


PAGE_CALL = ("<tool_call>\n<function=open_page>\n<parameter=page>\nSeine\n</parameter>\n<parameter=offset>\n"
             "{}\n</parameter>\n</function>\n</tool_call>")
TOOL_SETS = [RolloutBudgets(), RolloutBudgets(tools="search,open_page"),
             RolloutBudgets(tools="open_page,search", max_calls_per_turn=2)]


def as_pairs(calls):
    return [(c.name, c.arguments if isinstance(c, ToolCall) else c.reason) for c in calls]


@given(tag_soup | near_miss_calls() | st.lists(near_miss_calls() | st.sampled_from(
    [PAGE_CALL.format(2), PAGE_CALL.format("two"), PAGE_CALL.format(" -3 ")]), min_size=1, max_size=3).map("\n".join),
       st.sampled_from(TOOL_SETS))
@example("<tool_call>\n<function=search>\n<parameter=query>\n \n</parameter>\n</function>\n</tool_call>", TOOL_SETS[0])
@example("<tool_call>\n<function=search>\n<parameter=query>\na > b\n</parameter>\n</function>\n</tool_call>",
         TOOL_SETS[0])
@example("<tool_call>\n<function=search>\n<parameter=query>\na < b\n</parameter>\n</function>\n</tool_call>",
         TOOL_SETS[0])
@example("</tool_call><tool_call><function=search><parameter=query>x</parameter></function></tool_call>", TOOL_SETS[0])
@example("<tool_call><function=search><parameter=query>x</parameter></function></tool_call>\n<tool_call>", TOOL_SETS[0])
def test_the_parser_reads_every_turn_as_the_reference_loops_own_parser_does(text, budgets):
    """With search alone this is Search-R1's rule (the reference's ``query`` is the engine's);
    with two tools and parallel calls, every call and every refusal's reason agree."""
    parsed = parse_assistant(text, declared_tools(budgets), budgets.max_calls_per_turn)
    text_seen, kind, calls = reference_parse(text, budgets)
    assert (parsed.text, parsed.kind.value, as_pairs(parsed.calls)) == (text_seen, kind, calls)


def call_text(name: str, **arguments: str) -> str:
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


OPEN_PAGE = ToolSpec(
    name="open_page", description="Open a page.", unit="page",
    parameters={"type": "object", "properties": {"page": {"type": "string"}, "offset": {"type": "integer"}},
                "required": ["page"]},
)


@given(name=names.filter(lambda n: n not in ("search", "open_page")))
def test_an_undeclared_function_is_refused_by_name(name):
    (call,) = parse_assistant(call_text(name, query="x"), (SEARCH, OPEN_PAGE)).calls
    assert isinstance(call, CallError) and call.name == name and "unknown tool" in call.reason
    assert "search" in call.reason and "open_page" in call.reason


@given(value=st.text(max_size=12).filter(lambda v: "<" not in v and not v.strip().lstrip("+-").isdigit()))
def test_a_value_of_the_wrong_type_is_refused_naming_the_parameter_and_type(value):
    parsed = parse_assistant(call_text("open_page", page="Paris", offset=value), (OPEN_PAGE,))
    assert parsed.kind == TurnKind.INVALID
    (call,) = parsed.calls
    assert isinstance(call, CallError) and "offset" in call.reason and "integer" in call.reason


def test_a_missing_required_parameter_and_an_unknown_one_are_refused():
    missing = parse_assistant(call_text("open_page", offset="3"), (OPEN_PAGE,)).calls[0]
    unknown = parse_assistant(call_text("open_page", page="x", lang="en"), (OPEN_PAGE,)).calls[0]
    assert isinstance(missing, CallError) and "page" in missing.reason
    assert isinstance(unknown, CallError) and "lang" in unknown.reason


def test_several_calls_are_read_in_order_and_more_than_allowed_is_invalid():
    text = call_text("search", query="Seine") + "\n" + call_text("open_page", page="Seine", offset="2")
    parsed = parse_assistant(text, (SEARCH, OPEN_PAGE), max_calls=2)
    assert parsed.kind == TurnKind.TOOL
    assert parsed.calls == (ToolCall("search", {"query": "Seine"}), ToolCall("open_page", {"page": "Seine", "offset": 2}))
    assert parse_assistant(text, (SEARCH, OPEN_PAGE), max_calls=1).kind == TurnKind.INVALID
    between = text.replace("</tool_call>\n<tool_call>", "</tool_call>\nand then\n<tool_call>")
    (refused,) = parse_assistant(between, (SEARCH, OPEN_PAGE), max_calls=2).calls
    assert isinstance(refused, CallError) and "not closed <tool_call> blocks" in refused.reason


tools_drawn = st.builds(
    lambda name, props: ToolSpec(name, "", {"type": "object", "properties": props}, "call"),
    names, st.dictionaries(names, st.builds(lambda t: {"type": t}, st.sampled_from(TYPES + ("null",)))),
)


@given(text=st.text() | tag_soup, tools=st.lists(tools_drawn, max_size=3))
def test_reading_calls_never_raises(text, tools):
    parsed = parse_tool_calls(text, tools)
    assert (parsed is None) == ("<tool_call>" not in text)


@given(st.sampled_from(TYPES), st.text(max_size=10))
def test_a_value_converts_to_its_declared_type_or_is_refused(kind, text):
    ok, value = convert_value(text, {"type": kind})
    wanted = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    assert not ok or isinstance(value, wanted[kind])


def test_enum_and_nullable_types_are_honoured():
    assert convert_value("red", {"type": "string", "enum": ["red", "blue"]}) == (True, "red")
    assert convert_value("green", {"type": "string", "enum": ["red", "blue"]})[0] is False
    assert convert_value("null", {"type": ["integer", "null"]}) == (True, None)
    assert convert_value("null", {"type": "string"}) == (True, "null")


contents = st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from(
    ["\n", " "]), min_size=1, max_size=30), min_size=1, max_size=4)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(observations=contents)
def test_several_tool_responses_stitch_to_the_tokens_the_template_renders(tokenizer, observations):
    """One observation per call, joined as the template joins tool responses: the stitched tokens are
    the full render's (contents without special-token strings, normalised as the tokenizer does)."""
    from hypothesis import assume

    from searchr1.core.protocol import assistant_message, observation_tokens, render, tool_message

    assume(all(tag not in text for text in observations for tag in tokenizer.get_added_vocab()))
    before = initial_messages("q?") + [assistant_message("calls")]
    messages = [tool_message(f"c{i}", text) for i, text in enumerate(observations)]
    ended = render(tokenizer, before, add_generation_prompt=False)
    full = render(tokenizer, before + messages, add_generation_prompt=True)
    assert full[: len(ended)] == ended
    assert full[len(ended):] == observation_tokens(tokenizer, observations)


COLOURS = ToolSpec(
    name="paint", description="", unit="call",
    parameters={"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}, "coats": {"type": ["integer", "null"]},
                                                 "note": {"type": "string"}}},
)


def refusal(**arguments: str) -> str:
    (call,) = parse_assistant(call_text("paint", **arguments), (COLOURS,)).calls
    assert isinstance(call, CallError)
    return call.reason


def test_a_refusal_names_the_parameter_its_type_as_declared_and_the_value_on_one_line():
    assert refusal(coats="many") == "parameter coats of paint must be integer or null, got 'many'"
    assert refusal(colour="green") == "parameter colour of paint must be string, got 'green'"  # no type: a string
    assert refusal(coats="a \n\n b") == "parameter coats of paint must be integer or null, got 'a b'"


def test_a_value_in_a_refusal_is_cut_to_forty_characters_with_an_ellipsis():
    forty, longer = "x" * 40, "y" * 41
    assert refusal(coats=forty).endswith(f"got '{forty}'")
    assert refusal(coats=longer).endswith("got '" + "y" * 39 + "…'")
    (unknown,) = parse_assistant(call_text("p" * 41), (COLOURS,)).calls
    assert unknown.reason.startswith("unknown tool '" + "p" * 39 + "…' (declared: paint)")


def as_the_template_writes(value) -> str:
    """Qwen3.5's template: a mapping or a list as JSON, anything else through Python's ``str``."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else str(value)


typed_values = st.one_of(*(st.tuples(st.just(kind), VALUES[kind]) for kind in TYPES), st.tuples(st.just("null"), st.none()))


@given(typed_values)
@example(("string", " two words "))
@example(("integer", -7))
@example(("number", 2.5))
@example(("number", -1e300))
@example(("boolean", True))
@example(("boolean", False))
@example(("array", [1, "a", None]))
@example(("object", {"k": [1.5]}))
@example(("null", None))
def test_each_type_reads_back_what_the_template_wrote(kind_and_value):
    kind, value = kind_and_value
    ok, read = convert_value(as_the_template_writes(value), {"type": kind})
    assert ok and read == value and (type(read) is type(value) or kind == "number")


@given(st.sampled_from(TYPES + ("null",)), st.text(max_size=8))
@example("boolean", "maybe")
@example("integer", "1.5")
@example("integer", "5")
@example("number", "inf")
@example("number", "nan")
@example("number", "ten")
@example("array", "{}")
@example("object", "[]")
@example("array", "[1,")
@example("null", "nil")
def test_text_that_is_not_a_value_of_the_type_is_refused(kind, text):
    def is_int(text: str) -> bool:  # Python's int() reads more than a JSON integer: a wider net
        try:
            return int(text) is not None
        except ValueError:
            return False

    readable = {
        "string": True,
        "integer": is_int(text),
        "boolean": text.strip().lower() in ("true", "false"),
        "null": text.strip().lower() in ("null", "none"),
    }
    if kind in readable and not readable[kind]:
        assert convert_value(text, {"type": kind}) == (False, None)
    if kind == "number":
        try:
            finite = math.isfinite(float(text))
        except ValueError:
            finite = False
        assert convert_value(text, {"type": kind})[0] == finite
    if kind in ("array", "object"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        assert convert_value(text, {"type": kind})[0] == isinstance(parsed, list if kind == "array" else dict)


def test_a_whole_number_is_read_as_an_integer_and_any_other_number_as_a_float():
    read = [convert_value(text, {"type": "number"}) for text in ("3", " -12 ", "2.5", "1e3")]
    assert [(ok, value, type(value)) for ok, value in read] == [
        (True, 3, int), (True, -12, int), (True, 2.5, float), (True, 1000.0, float)]


def test_a_nullable_string_reads_null_as_null_whichever_type_is_listed_first():
    for declared in (["string", "null"], ["null", "string"]):
        assert convert_value("null", {"type": declared}) == (True, None)
        assert convert_value("None", {"type": declared}) == (True, None)
        assert convert_value("Paris", {"type": declared}) == (True, "Paris")


def test_a_type_the_parser_does_not_know_keeps_the_text_as_written():
    for schema in ({"type": "date"}, {"type": ["date"]}, {}):
        assert convert_value(" 2024-01-01 ", schema) == (True, " 2024-01-01 ")


def test_a_block_that_is_not_one_function_is_refused_without_a_name():
    assert read_call("just text", {"search": SEARCH}) == CallError("", "the tool call is not one <function=…> block")


def test_with_no_tool_declared_every_function_is_unknown():
    inside = "<function=search>\n<parameter=query>\nx\n</parameter>\n</function>"
    assert read_call(inside, {}) == CallError("search", "unknown tool 'search' (declared: none)")


def test_a_tool_open_to_more_parameters_keeps_each_as_written_and_a_closed_one_refuses_them():
    open_tool = ToolSpec("lookup", "", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
                                        "additionalProperties": True}, "call")
    inside = "<function=lookup>\n<parameter=lang>\nen\n</parameter>\n<parameter=q>\nParis\n</parameter>\n</function>"
    assert read_call(inside, {"lookup": open_tool}) == ToolCall("lookup", {"lang": "en", "q": "Paris"})
    for closed in (False, None):
        parameters = {key: value for key, value in open_tool.parameters.items() if key != "additionalProperties"}
        tool = replace(open_tool, parameters=parameters if closed is None else {**parameters,
                                                                                "additionalProperties": closed})
        assert read_call(inside, {"lookup": tool}) == CallError("lookup", "lookup has no parameter 'lang'")


def test_every_missing_parameter_is_named():
    properties = {"start": {"type": "string"}, "end": {"type": "string"}}
    tool = ToolSpec("route", "", {"type": "object", "properties": properties, "required": ["start", "end"]}, "call")
    assert read_call("<function=route>\n</function>", {"route": tool}) == CallError(
        "route", "route needs the parameter start, end")


def test_a_call_opened_inside_another_is_refused_as_calls_that_are_not_closed_blocks():
    text = "<tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_calls(text, (SEARCH,)) == (
        "", [CallError("", "the tool calls are not closed <tool_call> blocks ending the turn")])


def test_calls_that_are_not_closed_blocks_keep_the_text_before_the_first_call():
    call = "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n</tool_call>"
    for text in (f"Let me look.\n{call}\nand then\n{call}", f"Let me look.\n{call}\n<tool_call>"):
        assert parse_tool_calls(text, (SEARCH,)) == (
            "Let me look.\n", [CallError("", "the tool calls are not closed <tool_call> blocks ending the turn")])


def test_a_tool_list_naming_an_undeclared_tool_is_refused_naming_the_first_and_the_declared_ones():
    refusal = "names an undeclared tool 'calculator' (declared: search, open_page)"
    assert unknown_tools("search,calculator") == unknown_tools("calculator, search, abacus") == refusal
    assert unknown_tools("search, open_page") is None


@given(st.lists(st.sampled_from(["search", "open_page", " search", "open_page "]) | st.text(max_size=12),
                max_size=4).filter(lambda names: all("," not in name for name in names)))
def test_a_tool_list_is_read_alike_from_every_form_and_refused_unless_each_name_is_declared_once(names):
    """``--tools``, config.json and scenario files spell the list comma-separated or as a list: every
    form reads as the same tuple of stripped names (no name at all: a closed-book rollout), and a
    list with an empty or undeclared name or a name twice is refused naming ``--tools``."""
    expected = tuple(name.strip() for name in names)
    good = set(expected) <= set(DECLARED) and len(set(expected)) == len(expected)
    for form in [tuple(names), list(names)] + [",".join(names)] * bool(names):
        if good:
            assert RolloutBudgets(tools=form).tools == expected
        else:
            with pytest.raises(SettingError, match="^--tools "):
                RolloutBudgets(tools=form)

"""Reading chat-completions requests: any JSON at all is a request or one refusal naming a field,
a question without tools is the agent's, and a turn's calls come back as the calls the client's
tools accept, or, for a client without tools, not at all."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from searchr1.serve.chat_api import (CALL_MARKUP, FIELDS, FieldError, Reply, chunks, completion, parse_chat_request,
                                     read_reply)

SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}, "required": ["query"]}}}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot", None])
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": st.none() | st.text(max_size=10) | st.lists(json_values, max_size=2),
    "tool_call_id": json_values,
    "tool_calls": st.lists(st.fixed_dictionaries({}, optional={
        "id": json_values, "type": json_values,
        "function": st.fixed_dictionaries({}, optional={"name": json_values, "arguments": json_values | st.just('{"q": 1}')})}),
        max_size=2) | json_values}), max_size=4)
requests = st.fixed_dictionaries({}, optional={
    "messages": messages | json_values, "tools": st.lists(json_values, max_size=2) | json_values,
    **{name: json_values for name in FIELDS if name not in ("messages", "tools")}})


@given(body=requests | json_values)
def test_any_json_is_a_request_or_one_refusal_naming_its_field(body):
    try:
        request = parse_chat_request(body)
    except FieldError as error:
        assert 400 <= error.status < 500
        assert str(error).startswith(f"{error.field}: ") and "\n" not in str(error)
        return
    assert request.messages and any(m["role"] == "user" for m in request.messages)
    assert request.messages[-1]["role"] in ("user", "tool")
    json.dumps(request.messages)  # what the template renders is plain JSON
    question = all(m["role"] in ("system", "developer", "user") for m in body["messages"])
    if body.get("agent") is not None:
        assert request.agent is body["agent"]
    else:  # left out: the agent answers a question that comes without tools
        assert request.agent == (question and not request.tools and body.get("tool_choice", "auto") == "auto")
    assert not (request.agent and request.tools)


def test_a_question_without_tools_is_the_agents_and_anything_else_one_turn():
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "who discovered penicillin?"}]
    assert parse_chat_request({"messages": question}).agent
    assert parse_chat_request({"messages": question, "tools": []}).agent
    assert not parse_chat_request({"messages": question, "agent": False}).agent
    assert not parse_chat_request({"messages": question, "tool_choice": "none"}).agent
    assert not parse_chat_request({"messages": question, "tools": [SEARCH]}).agent
    conversation = [*question, {"role": "assistant", "content": "Fleming."}, {"role": "user", "content": "When?"}]
    assert not parse_chat_request({"messages": conversation}).agent


def call(name: str, **arguments: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_a_turn_becomes_content_and_the_calls_the_clients_tools_accept():
    tools = parse_chat_request({"messages": [{"role": "user", "content": "q"}], "tools": [SEARCH]}).tools
    content, calls = read_reply("Let me look.\n\n" + call("search", query="Paris", k="3") + "<|im_end|>", tools)
    assert content == "Let me look." and [(c.name, c.arguments) for c in calls] == [("search", {"query": "Paris", "k": 3})]
    for refused in (call("calculator", x="1"), call("search", query="Paris", k="three")):
        assert read_reply(refused, tools) == (refused, ())  # not the client's tool: the text as written
    assert read_reply("Answer: Paris", ()) == ("Answer: Paris", ())


def test_a_call_is_written_with_its_arguments_as_a_json_string_and_streamed_in_openais_order():
    (tool,) = parse_chat_request({"messages": [{"role": "user", "content": "q"}], "tools": [SEARCH]}).tools
    _, calls = read_reply(call("search", query="Paris"), (tool,))
    reply = Reply(None, calls, "tool_calls", 10, 4, {"policy": "p"})
    message = completion(reply, "m")["choices"][0]["message"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"query": "Paris"}
    streamed = list(chunks(reply, "m", include_usage=True))
    assert [list(c["choices"][0]["delta"]) if c["choices"] else "usage" for c in streamed] == \
        [["role", "content"], ["tool_calls"], [], "usage"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "tool_calls" and streamed[-1]["usage"]["total_tokens"] == 14


@given(before=st.text(max_size=20), tag=st.sampled_from(CALL_MARKUP), after=st.text(max_size=40),
       name=st.sampled_from(["search", "calculator"]), stop=st.sampled_from(["", "<|im_end|>"]))
def test_a_turn_for_a_client_without_tools_never_shows_call_markup(before, tag, after, name, stop):
    """Whatever the model writes after the text, a client that declared no tools gets the text
    before the first piece of call markup as content, and no calls."""
    for text in (before + tag + after, before + call(name, query=after) + stop):
        content, calls = read_reply(text, ())
        assert calls == () and not any(piece in content for piece in CALL_MARKUP)
        if not any(piece in before for piece in CALL_MARKUP):
            assert content == before.rstrip()

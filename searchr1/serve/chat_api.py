"""OpenAI's chat-completions shapes, read and written (pure: no model, no server).

A request (``POST /v1/chat/completions``) is read into a :class:`ChatRequest`: the messages as
the Qwen3.5 chat template takes them (an assistant's ``tool_calls[].function.arguments``, a JSON
string on the wire, becomes the mapping the template renders), the client's ``tools`` as
:class:`~searchr1.core.tools.ToolSpec` declarations (so the model's calls are read against the
client's own schemas, with the same parser the rollout uses), and the sampling fields. Anything
this server cannot honour is a :class:`FieldError` naming the field (``messages[2].role``), never
a guess. One extension: ``"agent": true`` asks the server to run its own declared tools and
answer with the final reply, the turns attached. A request that leaves ``agent`` out is an agent
request when it is a question (system and user messages only) and declares no tools: the served
model is a search agent, and a client that does not run its tools gets its answer the way an
OpenAI model that searches on its own gives one. A turn sampled for a request without tools
never carries tool-call markup (:func:`without_call_markup`).

An answer is written as OpenAI writes it: a ``chat.completion`` with one choice whose message has
``content`` and, when the model called tools, ``tool_calls`` (``id``, ``type: "function"``,
``function.name``, ``function.arguments`` as a JSON string) and ``finish_reason: "tool_calls"``;
or, streamed, ``chat.completion.chunk`` objects (the role, then the content, then each tool
call, then the finish reason), as server-sent events ending with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, TypeVar

from searchr1.core.protocol import without_stop_strings
from searchr1.core.tools import ToolCall, ToolSpec, parse_tool_calls
from searchr1.core.types import JsonObject, JsonValue, Message
from searchr1.runtime.http_bounds import RequestError, shown

MAX_BODY_BYTES = 1 << 20
MAX_MESSAGES = 256
MAX_TOOLS = 64
MAX_TOKENS = 8192  # the most one completion may ask for (the rollout's own cap applies in agent mode)
ROLES = ("system", "developer", "user", "assistant", "tool")
FIELDS = ("model", "messages", "tools", "tool_choice", "stream", "stream_options", "agent", "max_tokens",
          "max_completion_tokens", "temperature", "top_p", "seed", "n", "parallel_tool_calls", "user")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# What the Qwen3.5 chat template writes around a call; a turn for a request without tools ends before any of it.
CALL_MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
QUESTION_ROLES = ("system", "user")  # the messages of an agent request
Number = TypeVar("Number", int, float)


class FieldError(RequestError):
    """A request refused because of one field (``field`` as a JSON path, e.g. ``messages[2].role``)."""

    def __init__(self, field_path: str, message: str, status: int = 422) -> None:
        super().__init__(status, f"{field_path}: {message}")
        self.field = field_path


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completions request, checked."""

    model: str
    messages: list[JsonObject]          # as the chat template takes them
    tools: tuple[ToolSpec, ...] = ()    # the client's tools ("agent": the server's own are used)
    stream: bool = False
    agent: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    include_usage: bool = False         # stream_options.include_usage

    @property
    def question(self) -> str:
        """The first user message's text (the question, for agent mode and the offline twin)."""
        return next(str(m["content"]) for m in self.messages if m["role"] == "user")


class ReplyExtra(TypedDict, total=False):
    """The fields an answer carries beside OpenAI's: what produced it, and an agent's turns."""

    policy: str
    turns: list[Message]  # every message after the system prompt
    termination: str
    tool_calls_made: int


@dataclass(frozen=True)
class Reply:
    """What the model said in one turn, in OpenAI's terms."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"          # stop | tool_calls | length
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: ReplyExtra = field(default_factory=ReplyExtra)  # fields beside the message (agent turns, policy)


# --------------------------------------------------------------------------- reading a request


def parse_chat_request(payload: object) -> ChatRequest:
    """A decoded body as a :class:`ChatRequest`, or :class:`FieldError` naming what is wrong."""
    if not isinstance(payload, dict):
        raise FieldError("body", "must be a JSON object with 'messages'")
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        name = unknown[0] if _TOOL_NAME.fullmatch(unknown[0]) else shown(unknown[0])  # a client's key, quoted safely
        raise FieldError(name, f"this server does not take it (it takes {', '.join(FIELDS)})")
    model = payload.get("model", "")
    if not isinstance(model, str):
        raise FieldError("model", f"must be a string, got {shown(model)}")
    n = payload.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise FieldError("n", f"only 1 is served, got {shown(n)}")
    tool_choice = payload.get("tool_choice", "auto")
    if tool_choice not in ("auto", "none"):
        raise FieldError("tool_choice", f"only 'auto' and 'none' are served, got {shown(tool_choice)}")
    tools = () if tool_choice == "none" else parse_tools(payload.get("tools", []))
    messages = parse_messages(payload.get("messages"))
    is_question = all(m["role"] in QUESTION_ROLES for m in messages)
    if payload.get("agent") is None:  # left out: a question without tools is the agent's
        agent = is_question and not tools and tool_choice == "auto"
    else:
        agent = _flag(payload, "agent")
    if agent and tools:
        raise FieldError("tools", "an agent request runs the server's own tools; send no tools with agent: true")
    if agent and not is_question:
        raise FieldError("messages", "an agent request is a question: system and user messages only")
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
    stream_options = payload.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise FieldError("stream_options", "only {'include_usage': true|false} is served")
    return ChatRequest(
        model=model, messages=messages, tools=tools, stream=_flag(payload, "stream"), agent=agent,
        max_tokens=_number(payload, name, int, 1, MAX_TOKENS) if limit is not None else None,
        temperature=_number(payload, "temperature", float, 0.0, 2.0),
        top_p=_number(payload, "top_p", float, 0.0, 1.0, low_open=True),
        seed=_number(payload, "seed", int, 0, 2**63 - 1),
        include_usage=stream_options.get("include_usage", False) is True,
    )


def _flag(payload: Mapping[str, object], name: str) -> bool:
    value = payload.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError(name, f"must be true or false, got {shown(value)}")
    return value


def _number(payload: Mapping[str, object], name: str, kind: type[Number], low: float, high: float, *,
            low_open: bool = False) -> Number | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise FieldError(name, f"must be {'an integer' if kind is int else 'a number'}, got {shown(value)}")
    if not (low < value if low_open else low <= value) or not value <= high or value != value:
        raise FieldError(name, f"must be from {low} to {high}, got {shown(value)}")
    return kind(value)


def _text(value: object, where: str) -> str:
    """A message's content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for position, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise FieldError(f"{where}[{position}]", "only text parts ({'type': 'text', 'text': ...}) are served")
            parts.append(part["text"])
        return "".join(parts)
    raise FieldError(where, f"must be a string or a list of text parts, got {shown(value)}")


def parse_messages(value: object) -> list[JsonObject]:
    """The messages as the chat template takes them (see the module docstring)."""
    if not isinstance(value, list) or not value:
        raise FieldError("messages", "must be a non-empty list of messages")
    if len(value) > MAX_MESSAGES:
        raise FieldError("messages", f"holds {len(value)} messages; at most {MAX_MESSAGES}")
    messages: list[JsonObject] = []
    for position, message in enumerate(value):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise FieldError(where, f"must be an object, got {shown(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise FieldError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {shown(role)}")
        calls = message.get("tool_calls") if role == "assistant" else None
        content = message.get("content")
        if content is None and calls:
            content = ""
        converted: JsonObject = {"role": "system" if role == "developer" else role,
                                 "content": _text(content, f"{where}.content")}
        if calls:
            converted["tool_calls"] = _calls(calls, f"{where}.tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise FieldError(f"{where}.tool_call_id", "a tool message names the call it answers")
            converted["tool_call_id"] = call_id
        messages.append(converted)
    if not any(m["role"] == "user" for m in messages):
        raise FieldError("messages", "holds no user message")
    if messages[-1]["role"] not in ("user", "tool"):
        raise FieldError(f"messages[{len(messages) - 1}].role", "the last message must be the user's or a tool's")
    return messages


def _calls(value: object, where: str) -> list[JsonValue]:
    if not isinstance(value, list):
        raise FieldError(where, f"must be a list, got {shown(value)}")
    calls: list[JsonValue] = []
    for position, call in enumerate(value):
        at = f"{where}[{position}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise FieldError(f"{at}.function", "must be an object with a name and arguments")
        arguments = function.get("arguments", "{}")
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else None
        except (ValueError, RecursionError):
            decoded = None
        if not isinstance(decoded, dict):
            raise FieldError(f"{at}.function.arguments", "must be a JSON object encoded as a string")
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": decoded}})
    return calls


def parse_tools(value: object) -> tuple[ToolSpec, ...]:
    """The client's tools as declarations the parser reads calls against."""
    if not isinstance(value, list):
        raise FieldError("tools", f"must be a list, got {shown(value)}")
    if len(value) > MAX_TOOLS:
        raise FieldError("tools", f"holds {len(value)} tools; at most {MAX_TOOLS}")
    specs: list[ToolSpec] = []
    for position, tool in enumerate(value):
        where = f"tools[{position}]"
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict):
            raise FieldError(where, "must be {'type': 'function', 'function': {...}}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise FieldError(f"{where}.function.name", f"must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {shown(name)}")
        if any(spec.name == name for spec in specs):
            raise FieldError(f"{where}.function.name", f"{name!r} is declared twice")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise FieldError(f"{where}.function.description", f"must be a string, got {shown(description)}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object" or \
                not isinstance(parameters.get("properties", {}), dict) or \
                not all(isinstance(p, dict) for p in parameters.get("properties", {}).values()):
            raise FieldError(f"{where}.function.parameters", "must be a JSON schema of type object with properties")
        specs.append(ToolSpec(name=name, description=description, parameters=parameters, unit="call"))
    return tuple(specs)


# --------------------------------------------------------------------------- writing an answer


def without_call_markup(text: str) -> str:
    """``text`` up to the first piece of tool-call markup (:data:`CALL_MARKUP`), trailing space
    removed; ``text`` itself when it holds none."""
    cut = min((text.find(tag) for tag in CALL_MARKUP if tag in text), default=-1)
    return text if cut < 0 else text[:cut].rstrip()


def read_reply(text: str, tools: Sequence[ToolSpec]) -> tuple[str | None, tuple[ToolCall, ...]]:
    """``(content, tool_calls)`` of a sampled turn: the calls it makes of ``tools``, and the text
    before them. With tools, a turn whose calls the tools do not accept (an undeclared function,
    a bad argument) is returned as text, as it was written; without tools, the text before any
    call markup is the content (a client that declared no tools is never shown a call)."""
    body = without_stop_strings(text)
    if not tools:
        return without_call_markup(body), ()
    parsed = parse_tool_calls(body, tools)
    if parsed is None or not parsed[1] or not all(isinstance(call, ToolCall) for call in parsed[1]):
        return body, ()
    before, calls = parsed
    return (before.strip() or None), tuple(call for call in calls if isinstance(call, ToolCall))


def _tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, object]]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
            for call in calls]


def _usage(reply: Reply) -> JsonObject:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def completion(reply: Reply, model: str) -> dict[str, object]:
    """A ``chat.completion`` object."""
    message: dict[str, object] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply.tool_calls)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                                         "logprobs": None}],
            "usage": _usage(reply), **reply.extra}


def chunks(reply: Reply, model: str, *, include_usage: bool = False) -> Iterator[dict[str, object]]:
    """The ``chat.completion.chunk`` objects of a streamed answer, in OpenAI's order."""
    head: dict[str, object] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                               "created": int(time.time()), "model": model}

    def chunk(delta: Mapping[str, object], finish_reason: str | None = None) -> dict[str, object]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    if reply.content:
        yield chunk({"content": reply.content})
    for index, call in enumerate(_tool_calls(reply.tool_calls)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield {**chunk({}, reply.finish_reason), **reply.extra}
    if include_usage:
        yield {**head, "choices": [], "usage": _usage(reply)}


def sse(events: Iterable[Mapping[str, object]]) -> Iterator[str]:
    """Server-sent events: one ``data:`` line per object, then ``data: [DONE]``."""
    for event in events:
        yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"

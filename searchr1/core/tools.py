"""Tools as declared data, and how a turn's tool calls are read.

A tool is declared once, as a :class:`ToolSpec`: its name, what the model is told about it, its
parameters as a JSON schema, and how many calls a trajectory gets. The schema is what the chat
template shows the model, and the same schema is what the parser checks each call against.

Qwen3.5 writes a call in XML, one ``<parameter=…>`` block per argument::

    <tool_call>
    <function=search>
    <parameter=query>
    Eiffel Tower height
    </parameter>
    </function>
    </tool_call>

The official template writes each value as text: a string as it is, a mapping or a list as JSON,
anything else with Python's ``str`` (so ``True``, ``3``, ``2.5``), with one newline on each side.
:func:`parse_tool_calls` reads it back the way vLLM's ``qwen3_coder`` tool parser does (one
newline stripped on each side, then the text converted by the parameter's schema type), with one
difference: a value that does not convert is a refused call (:class:`CallError`), never a string
passed on in its place. The rollout decides what a refused call costs (:class:`~searchr1.core.budgets.InvalidCallPolicy`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from searchr1.core.types import JsonObject, JsonValue, SearchResult


ArgumentCheck = Callable[[Mapping[str, JsonValue]], "str | None"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool, declared once.

    ``parameters`` is a JSON schema of type ``object`` (``properties``, ``required``, and
    optionally ``additionalProperties: true``); each property's ``type`` (``string``,
    ``integer``, ``number``, ``boolean``, ``array``, ``object``, ``null``, or a list of them) and
    ``enum`` are what a call is checked against. ``check`` is a rule the schema cannot say (the
    search query must not be blank); it returns the reason a call is refused, or ``None``.
    ``budget``: calls one trajectory may make (``None``: no limit of its own). ``unit``: what one
    call is counted as in usage and cost. What the model reads of it: ``guidance``, a line the
    system prompt adds when the tool is offered; ``error_head`` before a failed call's error;
    ``nothing`` for a result without items; ``takes_ids``: it reads the passage ids results show.
    """

    name: str
    description: str
    parameters: JsonObject
    unit: str
    budget: int | None = None
    check: ArgumentCheck | None = field(default=None, compare=False)
    guidance: str | None = None
    error_head: str | None = None  # None: "Tool error (<name>)"
    nothing: str | None = None  # None: "<name> returned nothing."
    takes_ids: bool = False

    def schema(self) -> JsonObject:
        """The function schema the chat template renders into the system prompt."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @property
    def properties(self) -> Mapping[str, JsonValue]:
        properties = self.parameters.get("properties", {})
        return properties if isinstance(properties, dict) else {}

    @property
    def required(self) -> tuple[str, ...]:
        required = self.parameters.get("required", [])
        return tuple(str(name) for name in required) if isinstance(required, list) else ()


# --------------------------------------------------------------------------- the declared tools

DEFAULT_TOOL_DESCRIPTION = "Look up evidence on the web. Pass one short English query."


def plain_query(arguments: Mapping[str, JsonValue]) -> str | None:
    """The search query must hold text, and no ``<`` or ``>`` (Search-R1's rule)."""
    query = str(arguments["query"])  # required: present before this rule is asked
    if not query.strip():
        return "the search query is blank"
    if "<" in query or ">" in query:
        return "the search query holds < or >"
    return None


def search_spec(description: str | None = None) -> ToolSpec:
    """The ``search`` tool (``--tool-description`` replaces its description; the name and the
    single required ``query`` string are the protocol)."""
    return ToolSpec(
        name="search",
        description=DEFAULT_TOOL_DESCRIPTION if description is None else description,
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "A short English search query."}},
            "required": ["query"],
        },
        unit="search",
        check=plain_query,
        error_head="Search error",
        nothing="Search returned no results.",
    )


SEARCH = search_spec()

def readable_page(arguments: Mapping[str, JsonValue]) -> str | None:
    """A page must be named, and an offset cannot go back before the start."""
    if not str(arguments["page"]).strip():
        return "the page name is blank"
    offset = arguments.get("offset", 0)
    if isinstance(offset, int) and offset < 0:
        return "the offset is negative"
    return None


OPEN_PAGE = ToolSpec(
    name="open_page",
    description="Read a page a search result names, passage by passage. Pass its title or id; "
                "offset skips that many passages, to read on.",
    parameters={
        "type": "object",
        "properties": {
            "page": {"type": "string", "description": "The title or id of a page from a search result."},
            "offset": {"type": "integer", "description": "Passages to skip (0 reads from the start)."},
        },
        "required": ["page"],
    },
    unit="page",
    budget=4,
    check=readable_page,
    guidance="- Each search result names its page. `open_page` reads that page passage by passage: pass its "
             "title or id, and an offset to read on.",
    takes_ids=True,
)

DECLARED: dict[str, ToolSpec] = {tool.name: tool for tool in (SEARCH, OPEN_PAGE)}


def without_ids(result: SearchResult) -> SearchResult:
    """``result`` with no passage ids: an id is what ``open_page`` takes, so a run without it is
    never shown one (its observations stay what they were before ids existed)."""
    if not any(item.ident for item in result.items):
        return result
    return replace(result, items=tuple(replace(item, ident=None) for item in result.items))


class ToolBackend(Protocol):
    """What runs one declared tool: a call in, its result out (search's backend too)."""

    async def call(self, call: ToolCall) -> SearchResult: ...


# --------------------------------------------------------------------------- parsed calls


@dataclass(frozen=True)
class ToolCall:
    """A call that names a declared tool with arguments its schema accepts, converted to their types."""

    name: str
    arguments: dict[str, JsonValue]


@dataclass(frozen=True)
class CallError:
    """A call that was refused, and why (one line). ``name`` is the function as written, ``""``
    when the call could not be read at all."""

    name: str
    reason: str


ParsedCall = ToolCall | CallError


def shown_call(call: ParsedCall) -> str:
    """A call in one line: the value of a tool's only parameter (a search's query), stripped; the
    arguments as ``key=value`` for a tool of several; a refused call's function name."""
    if isinstance(call, CallError):
        return call.name
    tool = DECLARED.get(call.name)
    if tool is not None and len(tool.properties) == 1:
        return str(next(iter(call.arguments.values()))).strip()
    return ", ".join(f"{key}={value}" for key, value in call.arguments.items())


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"\s*<function=([^<>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^<>\n]+)>(.*?)</parameter>", re.DOTALL)
_TAGS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")


def call_blocks(calls: str) -> list[str] | None:
    """Each call's inside, or ``None`` when ``calls`` (a turn from its first ``<tool_call>`` on) is
    not a run of ``<tool_call>…</tool_call>`` blocks with only whitespace between and after them."""
    blocks, position = [], 0
    for match in _BLOCK.finditer(calls):
        if calls[position:match.start()].strip() or "<tool_call>" in match.group(1):
            return None
        blocks.append(match.group(1))
        position = match.end()
    return blocks if blocks and not calls[position:].strip() else None


def _one_type(text: str, kind: str) -> tuple[bool, JsonValue]:
    """``(converted, value)`` of ``text`` read as the JSON-schema type ``kind`` (the value only
    counts when converted)."""
    word = text.strip()
    if kind in ("integer", "number") and re.fullmatch(r"[-+]?\d+", word):
        return True, int(word)
    if kind == "null":
        return word.lower() in ("null", "none"), None
    if kind == "boolean":
        return word.lower() in ("true", "false"), word.lower() == "true"
    if kind == "number":
        try:
            number = float(word)
        except ValueError:
            return False, None
        return math.isfinite(number), number
    if kind in ("array", "object"):
        try:
            value = json.loads(text)
        except ValueError:
            return False, None
        return isinstance(value, list if kind == "array" else dict), value
    return kind != "integer", text  # a string, or a type the parser does not know: as written, as vLLM does


def convert_value(text: str, schema: JsonObject) -> tuple[bool, JsonValue]:
    """``text`` (one newline already stripped on each side) converted by one property's schema:
    its ``type`` (a name, or a list tried in order; none means string) and its ``enum``."""
    declared = schema.get("type", "string")
    kinds = [str(k) for k in declared] if isinstance(declared, list) else [str(declared)]
    if "null" in kinds:  # "null" is read as null before a string type can take it as text
        kinds = ["null"] + [k for k in kinds if k != "null"]
    for kind in kinds:
        ok, value = _one_type(text, kind.strip().lower())
        if ok:
            allowed = schema.get("enum")
            if isinstance(allowed, list) and value not in allowed:
                return False, None
            return True, value
    return False, None


def _type_name(schema: JsonObject) -> str:
    declared = schema.get("type", "string")
    return " or ".join(map(str, declared)) if isinstance(declared, list) else str(declared)


def _shown(text: str, limit: int = 40) -> str:
    one_line = " ".join(text.split())
    return repr(one_line if len(one_line) <= limit else one_line[: limit - 1] + "…")


def read_call(inside: str, tools: Mapping[str, ToolSpec]) -> ParsedCall:
    """One ``<tool_call>`` block's inside, checked against the declared ``tools``."""
    function = _FUNCTION.fullmatch(inside)
    if function is None:
        return CallError("", "the tool call is not one <function=…> block")
    name, body = function.group(1), function.group(2)
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return CallError(name, f"unknown tool {_shown(name)} (declared: {known})")
    arguments: dict[str, JsonValue] = {}
    position = 0
    properties = tool.properties
    while (parameter := _PARAMETER.match(body, position)) is not None:
        position = parameter.end()
        key, raw = parameter.group(1), parameter.group(2)
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        if any(tag in value for tag in _TAGS):
            return CallError(name, f"parameter {_shown(key)} of {name} holds tool-call markup")
        if key in arguments:
            return CallError(name, f"parameter {_shown(key)} of {name} is given twice")
        if key not in properties:
            if tool.parameters.get("additionalProperties") is not True:
                return CallError(name, f"{name} has no parameter {_shown(key)}")
            arguments[key] = value
            continue
        schema = properties[key]
        schema = schema if isinstance(schema, dict) else {}  # a schema that is not an object says nothing
        ok, converted = convert_value(value, schema)
        if not ok:
            return CallError(name, f"parameter {key} of {name} must be {_type_name(schema)}, got {_shown(value)}")
        arguments[key] = converted
    if body[position:].strip():
        return CallError(name, f"the call of {name} holds text that is not a <parameter=…> block")
    missing = [key for key in tool.required if key not in arguments]
    if missing:
        return CallError(name, f"{name} needs the parameter {', '.join(missing)}")
    if tool.check is not None:
        reason = tool.check(arguments)
        if reason is not None:
            return CallError(name, reason)
    return ToolCall(name, arguments)


def parse_tool_calls(body: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ParsedCall]] | None:
    """The text before the calls and each call read against ``tools``; ``None`` when ``body``
    has no ``<tool_call>``. Calls that cannot be told apart (an unclosed call, text after the
    last call, a stray closing tag) come back as one :class:`CallError`."""
    start = body.find("<tool_call>")
    if start < 0:
        return None
    before = body[:start]
    blocks = None if "</tool_call>" in before else call_blocks(body[start:])
    if blocks is None:
        return before, [CallError("", "the tool calls are not closed <tool_call> blocks ending the turn")]
    by_name = {tool.name: tool for tool in tools}
    return before, [read_call(block, by_name) for block in blocks]

"""What the algorithm allows one rollout and how it samples and prompts (:class:`RolloutBudgets`,
each setting declared once), and the tools it offers the model (:func:`declared_tools`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal, get_args

from searchr1.core.context import ContextPolicy
from searchr1.core.settings import SettingError, check_settings, setting
from searchr1.core.tools import DECLARED, SEARCH, ToolSpec, search_spec
from searchr1.core.types import DEFAULT_MAX_TRAJECTORY_TOKENS, MAX_TOKENS, JsonObject

ToolOverflow = Literal["truncate", "end"]
TOOL_OVERFLOW_MODES: tuple[ToolOverflow, ...] = get_args(ToolOverflow)


def tool_list(names: object) -> tuple[str, ...]:
    """A tool list as a tuple of stripped names, from a tuple, a list or a comma-separated string
    (as ``--tools``, ``config.json`` and scenario files spell it)."""
    listed = names.split(",") if isinstance(names, str) else names if isinstance(names, (tuple, list)) else [names]
    return tuple(str(name).strip() for name in listed)


def unknown_tools(names: object) -> str | None:
    """Why a tool list is refused (an unknown or repeated name), or ``None``. No tool at all is a
    closed-book rollout (``probe-data``'s attempts without tools)."""
    listed = tool_list(names)
    unknown = [name for name in listed if name not in DECLARED]
    if unknown:
        return f"names an undeclared tool {unknown[0]!r} (declared: {', '.join(DECLARED)})"
    if len(set(listed)) != len(listed):
        return f"names a tool twice: {','.join(listed)!r}"
    return None


class InvalidCallPolicy(StrEnum):
    """What a refused call (unknown function, missing or unknown parameter, wrong type) does."""

    END = "end"  # the trajectory ends as invalid (Search-R1's rule)
    OBSERVE = "observe"  # the model reads a one-line tool error and goes on (verl's rule)


@dataclass(frozen=True)
class RolloutBudgets:
    """What the algorithm allows one rollout and how it samples and prompts (the lab port's names and
    defaults). Each field is declared once with its rule and help (:mod:`searchr1.core.settings`):
    the flags of train, eval and rollout are made from these lines. How the sampling service is
    driven (concurrency, timeouts, retries) is apart: :class:`searchr1.core.rollout.SamplingRuntime`."""

    group_size: int = setting(8, at_least=1, at_most=256, help="Trajectories per question.")
    max_search_calls: int = setting(4, at_least=0, at_most=100, help="Searches per trajectory.")
    max_assistant_turns: int = setting(6, at_least=1, at_most=100, help="Assistant turns per trajectory.")
    max_trajectory_tokens: int = setting(DEFAULT_MAX_TRAJECTORY_TOKENS, at_least=1, at_most=MAX_TOKENS,
                                         help="The trajectory's whole length in tokens (with --context full also "
                                              "its one context's, and the training datum limit).")
    max_assistant_tokens: int = setting(1024, at_least=1, at_most=MAX_TOKENS, help="Generation cap per assistant turn.")
    max_tool_response_tokens: int = setting(1024, at_least=1, at_most=MAX_TOKENS,
                                            help="Cap on one observation's content.")
    temperature: float = setting(1.0, at_least=0.0, help="Sampling temperature.")
    top_p: float = setting(1.0, above=0.0, at_most=1.0, help="Nucleus sampling mass.")
    seed: int = setting(42, cli=False)  # the command's --seed
    # "truncate": when not even the first item fits, truncate it at a token boundary and say so;
    # "end": the lab port's behaviour, the trajectory ends on its tool call.
    tool_overflow: ToolOverflow = setting(
        "truncate", choices=TOOL_OVERFLOW_MODES,
        help="When even the first search item does not fit: truncate it (marked) or end the trajectory (the lab port).")
    # Tell the model its search budget in the system prompt (docs/lab-port-differences.md).
    state_search_budget: bool = setting(True, cli=False)
    # The user's own wording (--system-prompt-file, --tool-description); None = the default.
    system_prompt: str | None = setting(None, cli=False)
    tool_description: str | None = setting(
        None, metavar="TEXT", default_text="the project's wording",
        help="Description of the search tool shown to the model.")
    # The tools the model may call (core/tools.py declares them), and what a refused call does.
    tools: tuple[str, ...] = setting(("search",), check=unknown_tools, metavar="NAMES",
                                     help="The tools the model may call, comma-separated, from those core/tools.py "
                                          "declares (search, open_page; open_page reads the pages of --backend "
                                          "local, wikipedia or retriever).")
    max_calls_per_turn: int = setting(1, at_least=1, at_most=16,
                                      help="Tool calls one turn may make; several run together (Search-R1: 1).")
    # How a context grows (core/context.py): full, or folded to fit a window of its own.
    context: ContextPolicy = setting(
        ContextPolicy.FULL, group="context", choices=tuple(policy.value for policy in ContextPolicy),
        help="full: one context that only grows (Search-R1); fold: when the next turn would not fit "
             "--context-window, earlier tool results become one-line stubs and a new context starts.")
    context_window: int | None = setting(
        None, group="context", at_least=64, at_most=MAX_TOKENS, metavar="TOKENS",
        default_text="--max-trajectory-tokens",
        help="With --context fold: the tokens one context may hold (also the training datum limit).")
    # Qwen3.5's thinking mode: the generation prompt opens <think>, so every turn reasons first.
    thinking: bool = setting(
        False, group="context",
        help="Render with the chat template's thinking on: each turn reasons inside <think> before it acts, "
             "the reasoning is trained on with the rest of the turn, and calls and the answer are read only "
             "after </think>.")
    invalid_calls: InvalidCallPolicy = setting(
        InvalidCallPolicy.END, choices=tuple(policy.value for policy in InvalidCallPolicy),
        help="A refused tool call (unknown tool, bad parameter): end the trajectory as invalid (Search-R1), "
             "or observe: tell the model why and go on.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tool_list(self.tools))  # a list or "a,b" as files hold it
        check_settings(self)
        if self.context_window is not None and self.context != ContextPolicy.FOLD:
            raise SettingError("--context-window", f"{self.context_window}: a window of its own needs --context fold")
        if self.context_window is not None and self.context_window > self.max_trajectory_tokens:
            raise SettingError("--context-window", f"{self.context_window}: larger than the whole trajectory "
                               f"(--max-trajectory-tokens {self.max_trajectory_tokens})")
        if self.context_window is not None and self.context_window <= self.max_assistant_tokens:
            raise SettingError("--context-window", f"{self.context_window}: a context must hold a prompt and a "
                               f"turn's generation cap (--max-assistant-tokens {self.max_assistant_tokens})")

    @property
    def window(self) -> int:
        """The tokens one context may hold: ``--context-window``, else the whole trajectory's budget."""
        return self.max_trajectory_tokens if self.context_window is None else self.context_window


def declared_tools(budgets: RolloutBudgets) -> tuple[ToolSpec, ...]:
    """The tools of ``budgets`` in the order given; search with its description and budget."""
    chosen = []
    for name in budgets.tools:
        tool = DECLARED[name]
        if tool.name == SEARCH.name:
            tool = replace(search_spec(budgets.tool_description), budget=budgets.max_search_calls)
        chosen.append(tool)
    return tuple(chosen)


def tool_schemas(budgets: RolloutBudgets) -> list[JsonObject]:
    """What the chat template shows the model: one function schema per declared tool."""
    return [tool.schema() for tool in declared_tools(budgets)]

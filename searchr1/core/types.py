"""The record of one multi-turn rollout: exactly the tokens that were sampled, plus what the
environment said. Messages are kept only for logs and for the chat template."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from searchr1.data.dataset import SearchExample

# Why a trajectory ended. Exactly one per finished trajectory.
TERMINATIONS = (
    "answer",          # the model answered: no tool call, exactly one non-empty Answer: line
    "no_answer",       # a reply with no tool call and no scorable Answer: line
    "invalid",         # malformed or disallowed tool call
    "search_budget",   # a valid tool call after the search budget was spent
    "turn_budget",     # a valid tool call on the last allowed assistant turn
    "token_budget",    # no room left in the trajectory for another assistant turn
    "tool_overflow",   # the observation could not be fitted (seed behaviour, opt-in)
    "search_error",    # the search result could not be turned into an observation at all
    "sampler_error",   # sampling failed after retries
    "prompt_too_long", # the initial prompt alone exceeds the trajectory budget
)


@dataclass
class AssistantTurn:
    prompt_tokens: list[int]       # the whole model input before this turn
    completion_tokens: list[int]   # exactly what the sampler returned
    logprobs: list[float]          # sampler (old-policy) logprob per completion token
    text: str
    stop_reason: str = "stop"


@dataclass
class SearchRecord:
    """One tool turn as the environment saw it (for transcripts and metrics)."""

    query: str
    ok: bool
    observation: str               # the tool-message text the model was shown
    items: int = 0
    error: str | None = None
    cached: bool = False
    truncated: bool = False        # the first item was cut to fit the budget


@dataclass
class Trajectory:
    example: SearchExample
    question_index: int
    group_index: int
    messages: list[dict[str, Any]]
    turns: list[AssistantTurn] = field(default_factory=list)
    searches: list[SearchRecord] = field(default_factory=list)
    next_prompt_tokens: list[int] | None = None
    search_calls: int = 0
    final_text: str = ""
    termination: str | None = None
    env_error: bool = False        # a search failed (the policy is not to blame)
    reward: float = -0.1
    advantage: float = 0.0
    # Why this trajectory sends no datum although it has completion tokens, if it doesn't:
    # "degenerate_group" (all rewards in its group equal), "env_failure_group" (a trajectory
    # of its group hit a search or sampler failure) or, when env failures are kept,
    # "sampler_error" (this trajectory's own sampling failed; it is left out of the mean).
    excluded: str | None = None
    valid_format: bool = False
    exact_match: bool = False
    f1: float = 0.0  # token F1 of the answer (0 unless it ended by answering)
    cover_em: bool = False  # a reference is a substring of the answer (Search-R1's subem)

    @property
    def done(self) -> bool:
        return self.termination is not None

    @property
    def sampler_error(self) -> bool:
        return self.termination == "sampler_error"

    def finish(self, reason: str, final_text: str | None = None) -> None:
        if reason not in TERMINATIONS:
            raise ValueError(f"unknown termination reason {reason!r}")
        if self.termination is not None:
            raise RuntimeError(
                f"trajectory q{self.question_index}/g{self.group_index} already ended "
                f"({self.termination}); cannot end it again as {reason}"
            )
        self.termination = reason
        if final_text is not None:
            self.final_text = final_text

    @property
    def total_tokens(self) -> int:
        """Length of the full token sequence (last prompt + last completion)."""
        if not self.turns:
            return 0
        last = self.turns[-1]
        return len(last.prompt_tokens) + len(last.completion_tokens)

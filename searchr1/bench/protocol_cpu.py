"""Figure 2: local CPU of a tool turn, ours against the lab port's way of fitting the observation.

The lab port built the next prompt once per candidate item with four chat-template renders each
(canonical prompt, the same with an empty assistant turn to learn the closing tokens, the
conversation ending with the assistant turn, and the next prompt), so a result of three items
cost twelve renders (the lab port's ``build_next_prompt`` and ``fit_tool_content``). Ours sizes the items with the
tokenizer and
renders twice, once, for the chosen content (:func:`searchr1.core.observation.fit.fit_tool_content`).

The tool turns are those of a real step: a zero-latency rollout of 8 questions x 8 samples with
up to 4 searches of 3 items each, through the real engine and the real tokenizer. Each tool
turn is then fitted both ways, passes interleaved, and must give the same content and the same
next prompt as the engine used. Reported: renders per tool turn (:func:`counted_renders`) and process
CPU per tool turn (``time.thread_time``: this thread only), medians over passes with their spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from searchr1.core.protocol import (
    TemplateDriftError,
    assistant_message,
    build_prompt,
    render,
    suffix_prefix_overlap,
    tool_message,
)
from searchr1.core.budgets import RolloutBudgets
from searchr1.core.observation.fit import fit_tool_content
from searchr1.core.observation.tokens import forget_remembered_texts
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.core.types import Message, SearchResult, Tokenizer, Trajectory
from searchr1.core.observation.text import observation_candidates
from searchr1.bench.report import LAB_PORT, Figure, Measure
from searchr1.bench.workload import WorkloadSpec, build_workload, quick_spec
from searchr1.runtime.tokenizer import Qwen35Tokenizer


@dataclass(frozen=True)
class ToolTurn:
    """The inputs of one observation fit, and what the engine made of them."""

    messages_before_assistant: list[Message]
    assistant_text: str
    previous_prompt_tokens: list[int]
    completion_tokens: list[int]
    call_id: str
    result: SearchResult
    content: str
    next_prompt: list[int] | None  # the engine's next prompt (None if it never sampled again)


def tool_turns(trajectories: Sequence[Trajectory], results: dict[str, SearchResult]) -> list[ToolTurn]:
    """Every tool turn of the rollout, rebuilt from the trajectories' records."""
    turns = []
    for t in trajectories:
        for k, record in enumerate(t.calls):
            turn = t.turns[k]
            tool = t.messages[2 + 2 * k + 1]
            following = t.turns[k + 1].prompt_tokens if k + 1 < len(t.turns) else None
            turns.append(ToolTurn(
                [m.copy() for m in t.messages[: 2 + 2 * k]], turn.text, list(turn.prompt_tokens),
                list(turn.completion_tokens), tool["tool_call_id"], results[record.query],
                record.observation, list(following) if following is not None else None,
            ))
    return turns


# ------------------------------------------------------------------------------- the lab port's way


def lab_port_build_next_prompt(tokenizer: Tokenizer, messages_before_assistant: list[Message],
                               assistant_text: str | Message, previous_prompt_tokens: Sequence[int],
                               completion_tokens: Sequence[int], next_tool_message: Message) -> list[int]:
    """The lab port's stitching: four renders, the closing tokens learnt afresh on every call
    (``assistant_text``: the turn's text, or its message as the engine passes it)."""
    canonical_prompt = build_prompt(tokenizer, messages_before_assistant)
    empty_turn = render(tokenizer, list(messages_before_assistant) + [assistant_message("")],
                        add_generation_prompt=False)
    if empty_turn[: len(canonical_prompt)] != canonical_prompt:
        raise TemplateDriftError("cannot extract the assistant closing from an empty assistant turn")
    closing = empty_turn[len(canonical_prompt):]
    assistant = assistant_message(assistant_text) if isinstance(assistant_text, str) else assistant_text
    with_assistant = list(messages_before_assistant) + [assistant]
    assistant_end = render(tokenizer, with_assistant, add_generation_prompt=False)
    next_prompt = render(tokenizer, with_assistant + [next_tool_message], add_generation_prompt=True)
    if next_prompt[: len(assistant_end)] != assistant_end:
        raise TemplateDriftError("the chat template rewrote history after the tool observation")
    observation = next_prompt[len(assistant_end):]
    overlap = suffix_prefix_overlap(completion_tokens, closing)
    return list(previous_prompt_tokens) + list(completion_tokens) + list(closing[overlap:]) + observation


def lab_port_fit_tool_content(tokenizer: Tokenizer, messages_before_assistant: list[Message],
                              assistant_text: str | Message, previous_prompt_tokens: Sequence[int],
                              completion_tokens: Sequence[int], call_id: str, result: SearchResult,
                              config: RolloutBudgets) -> tuple[str, list[int]] | None:
    """The lab port's greedy fit: for every candidate item, the token count of the joined content,
    then a whole next prompt (four renders) to check the trajectory budget; stop at the first
    item that does not fit. ``None`` when not even the first fits (no truncation)."""
    accepted: list[str] = []
    best: tuple[str, list[int]] | None = None
    for candidate in observation_candidates(result):
        joined = "\n\n".join(accepted + [candidate])
        if len(tokenizer.encode(joined, add_special_tokens=False)) > config.max_tool_response_tokens:
            break
        next_prompt = lab_port_build_next_prompt(tokenizer, messages_before_assistant, assistant_text,
                                             previous_prompt_tokens, completion_tokens,
                                             tool_message(call_id, joined))
        if len(next_prompt) > config.max_trajectory_tokens:
            break
        accepted.append(candidate)
        best = (joined, next_prompt)
    return best


# ------------------------------------------------------------------------------- measurement


def _fit_ours(tokenizer: Tokenizer, turn: ToolTurn, config: RolloutConfig) -> tuple[str, list[int]] | None:
    fitted = fit_tool_content(tokenizer, turn.messages_before_assistant, turn.assistant_text,
                              turn.previous_prompt_tokens, turn.completion_tokens, turn.call_id,
                              turn.result, config)
    return None if fitted is None else (fitted.content, fitted.next_prompt)


def _fit_lab_port(tokenizer: Tokenizer, turn: ToolTurn, config: RolloutConfig) -> tuple[str, list[int]] | None:
    return lab_port_fit_tool_content(tokenizer, turn.messages_before_assistant, turn.assistant_text,
                                 turn.previous_prompt_tokens, turn.completion_tokens, turn.call_id,
                                 turn.result, config)


FITTERS = {"ours": _fit_ours, LAB_PORT: _fit_lab_port}


P = ParamSpec("P")
R = TypeVar("R")


def _counting(function: Callable[P, R], calls: list[int]) -> Callable[P, R]:
    """``function``, adding an entry to ``calls`` each time it is called."""
    def counting(*args: P.args, **kwargs: P.kwargs) -> R:
        calls.append(1)
        return function(*args, **kwargs)
    return counting


@contextlib.contextmanager
def _shadowed(instance: object, name: str, value: object) -> Iterator[None]:
    """``instance.<name>`` is ``value`` while the block runs, then the class's attribute again."""
    setattr(instance, name, value)
    try:
        yield
    finally:
        delattr(instance, name)


@contextlib.contextmanager
def counted_renders(tokenizer: Tokenizer) -> Iterator[list[int]]:
    """Count the tokenizer's chat-template renders while the block runs (one entry per render)."""
    renders: list[int] = []
    with _shadowed(tokenizer, "apply_chat_template", _counting(tokenizer.apply_chat_template, renders)):
        yield renders


def measure_pass(kind: str, tokenizer: Qwen35Tokenizer, turns: Sequence[ToolTurn],
                 config: RolloutConfig) -> tuple[float, int, list[tuple[str, list[int]] | None]]:
    """CPU seconds and renders to fit every turn once; and the fits."""
    fit = FITTERS[kind]
    forget_remembered_texts(tokenizer)  # every pass encodes its texts as a step meets them, from cold
    with counted_renders(tokenizer) as renders:
        cpu = time.thread_time()  # this thread only: nothing else in the process counts
        fits = [fit(tokenizer, turn, config) for turn in turns]
        spent = time.thread_time() - cpu
    return spent, len(renders), fits


def protocol_cpu_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False,
                        repetitions: int | None = None, max_turns: int | None = None,
                        spec: WorkloadSpec | None = None) -> Figure:
    started = time.perf_counter()
    spec = spec or (quick_spec(WorkloadSpec(items_per_result=3)) if quick else WorkloadSpec(items_per_result=3))
    repetitions = repetitions if repetitions is not None else (1 if quick else 3)
    workload = build_workload(spec, seed + 101)
    from searchr1.wiring.services import scripted_sampling_client

    search = ScriptedSearch(workload.results)
    with scripted_sampling_client(workload.scenario, tokenizer) as sampler:  # the step itself is not timed
        trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(search), workload.examples,
                                                       workload.config))
    turns = tool_turns(trajectories, workload.results)
    if max_turns is not None:
        turns = turns[:max_turns]
    if not turns:
        raise RuntimeError("the protocol workload produced no tool turns")
    config = workload.config

    cpu: dict[str, list[float]] = {"ours": [], LAB_PORT: []}
    renders: dict[str, int] = {}
    for rep in range(repetitions):
        order = ("ours", LAB_PORT) if rep % 2 == 0 else (LAB_PORT, "ours")
        for kind in order:
            seconds, count, fits = measure_pass(kind, tokenizer, turns, config)
            cpu[kind].append(seconds)
            renders[kind] = count
            for turn, fitted in zip(turns, fits):
                if fitted is None or fitted[0] != turn.content or (
                    turn.next_prompt is not None and fitted[1] != turn.next_prompt
                ):
                    raise AssertionError(f"{kind} fit differs from the engine's for tool turn {turn.call_id}")

    n = len(turns)
    items = [len(turn.result.items) for turn in turns]
    figure = Figure(
        number=2, name="protocol_cpu", title="Protocol CPU per tool turn",
        measures=[
            Measure("renders_per_tool_turn", "ours: chat-template renders / tool turn", renders["ours"] / n, 2.0, "<=",
                    digits=1),
            Measure.of_samples("cpu_speedup_over_seed", "lab port CPU / ours CPU",
                               [theirs / ours for theirs, ours in zip(cpu[LAB_PORT], cpu["ours"])], 3.0, ">=", "x",
                               spread_bound=0.30),
            Measure("seed_renders_per_tool_turn", "lab port: renders / tool turn", renders[LAB_PORT] / n,
                    digits=1),
            Measure.of_samples("ours_cpu_ms_per_tool_turn", "ours: CPU / tool turn",
                               [1000.0 * c / n for c in cpu["ours"]], unit="ms", digits=1),
            Measure.of_samples("seed_cpu_ms_per_tool_turn", "lab port: CPU / tool turn",
                               [1000.0 * c / n for c in cpu[LAB_PORT]], unit="ms", digits=1),
        ],
        details={
            "tool_turns": n,
            "trajectories": len(trajectories),
            "items_per_result": sum(items) / n,
            "mean_prompt_tokens_before_turn": sum(len(t.previous_prompt_tokens) for t in turns) / n,
            "repetitions": repetitions,
            "thread_cpu_seconds": cpu,
            "renders": renders,
            "same_content_and_next_prompt": True,
        },
        notes=[(f"{n} tool turns of a {len(trajectories)}-trajectory step, {sum(items) / n:.1f} items each; "
               f"medians of {repetitions} interleaved pass(es); both ways give the engine's content and next prompt")],
    )
    figure.seconds = time.perf_counter() - started
    return figure

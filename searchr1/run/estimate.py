"""``train --estimate``: what a whole run would use, before it runs.

From the configured sizes alone nothing is sampled: each kind of :class:`~searchr1.run.usage.Usage`
gets a range per step, from its smallest possible value (every trajectory answers in one short
turn; no group carries a signal, so nothing is trained) to its largest (every trajectory uses
every turn, every search and the whole token budget). The first prompts are measured with the
tokenizer on the questions the run would draw. Search billing units (DeepSeek tokens) cannot
be bounded from sizes; they need a measured step.

``--estimate-measure`` runs one real step and projects the run from what it used (the step's
usage times the number of steps, saves as the schedule makes them), inside the same range. On
the offline twin that step costs nothing, and its reply lengths are the twin's, not the model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from searchr1.core.rollout import RolloutConfig
from searchr1.core.types import SearchExample, Tokenizer
from searchr1.run.costs import PriceTable
from searchr1.run.usage import Usage
from searchr1.basics.wording import plural

PROMPT_SAMPLE = 256  # first prompts measured with the tokenizer (the run's first questions)
TWIN_NOTE = ("measured on the offline twin: its reply lengths and searches are the twin's, not the real "
             "model's, so a live run's numbers will differ")


def scaled(usage: Usage, factor: float) -> Usage:
    """Every count of ``usage`` times ``factor`` (fractions kept)."""
    return usage.map(lambda value: value * factor)


def checkpoints_of(max_steps: int, save_every: int) -> int:
    """How many checkpoints a run of ``max_steps`` saves: every ``save_every`` steps and a final one."""
    periodic = max_steps // save_every if save_every else 0
    return periodic + (0 if save_every and max_steps % save_every == 0 else 1)


@dataclass
class Estimate:
    """Per-step and whole-run ranges (and, after a measured step, the projection inside them)."""

    steps: int
    step_low: Usage
    step_high: Usage
    run_low: Usage
    run_high: Usage
    step_measured: Usage | None = None
    run_projected: Usage | None = None
    notes: list[str] = field(default_factory=list)


def _with_saves(per_step: Usage, steps: int, checkpoints: int) -> Usage:
    """A run of ``steps`` steps like ``per_step`` (whose saves are the sampler's alone), with its checkpoints."""
    run = scaled(per_step, steps)
    run.weight_saves = per_step.weight_saves * steps + checkpoints
    run.state_saves = checkpoints
    return run


class PlannedRun(Protocol):
    """What an estimate reads of a run's settings (:class:`searchr1.training.config.TrainConfig`)."""

    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def questions_per_batch(self) -> int: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def save_every(self) -> int: ...
    @property
    def accumulation(self) -> str: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def search(self) -> Mapping[str, object]: ...


def configured_estimate(config: PlannedRun, tokenizer: Tokenizer, examples: Sequence[SearchExample]) -> Estimate:
    """The ranges from the configured sizes (nothing is sampled; the tokenizer measures the first prompts)."""
    from searchr1.core.budgets import tool_schemas
    from searchr1.core.protocol import build_prompt, initial_messages
    from searchr1.data.dataset import take_batch

    rollout = config.rollout
    questions, group = config.questions_per_batch, rollout.group_size
    trajectories = questions * group
    drawn = take_batch(examples, 0, min(len(examples), max(1, min(PROMPT_SAMPLE, questions * config.max_steps))))
    budget = rollout.max_search_calls if rollout.state_search_budget else None
    lengths = [len(build_prompt(tokenizer, initial_messages(e.question, max_search_calls=budget,
                                                            system_template=rollout.system_prompt),
                                tools=tool_schemas(rollout))) for e in drawn] or [1]
    shortest, longest = min(lengths), max(lengths)
    window = rollout.max_trajectory_tokens
    later_turns = rollout.max_assistant_turns - 1
    searches = min(rollout.max_search_calls, later_turns)
    backend = str(config.search.get("backend", "search")) if isinstance(config.search, Mapping) else "search"
    low, high = Usage(), Usage()
    low.sample_requests, high.sample_requests = questions, questions + trajectories * later_turns
    low.sample_prompt_tokens = questions * shortest
    high.sample_prompt_tokens = questions * longest + trajectories * later_turns * (window - 1)
    low.sample_generated_tokens = trajectories
    high.sample_generated_tokens = trajectories * min(rollout.max_assistant_turns * rollout.max_assistant_tokens,
                                                      max(1, window - shortest))
    high.train_tokens = trajectories * window
    high.forward_backward_calls = 1 if config.accumulation == "sdk" else trajectories
    high.optim_steps = 1
    if config.kl_coef:
        high.kl_requests, high.kl_generated_tokens = trajectories, trajectories
        high.kl_prompt_tokens = trajectories * window
    low.weight_saves = high.weight_saves = 1  # the sampler of each step's weights
    high.searched(backend).calls = high.searched(backend).requests = trajectories * searches
    low.searched(backend)
    checkpoints = checkpoints_of(config.max_steps, config.save_every)
    estimate = Estimate(config.max_steps, low, high, _with_saves(low, config.max_steps, checkpoints),
                        _with_saves(high, config.max_steps, checkpoints))
    estimate.notes.append(f"first prompts {shortest}-{longest} tokens (measured on {plural(len(drawn), 'question')}); "
                          "later prompts and replies bounded by the token budgets")
    if backend == "deepseek":
        estimate.notes.append("DeepSeek's search tokens cannot be bounded from sizes: add --estimate-measure")
    return estimate


def measured_estimate(line: Mapping[str, object], steps: int, *, offline: bool, bounds: Estimate) -> Estimate:
    """``bounds`` with the projection of a run of ``steps`` steps like the measured one (its metrics line)."""
    measured = Usage.from_metrics(line)
    checkpoints = int(bounds.run_high.state_saves)  # the schedule's checkpoints
    per_step = Usage()
    per_step.add(measured)
    per_step.state_saves = 0
    per_step.weight_saves = measured.weight_saves - measured.state_saves  # the step's sampler(s) alone
    bounds.step_measured = measured
    bounds.run_projected = _with_saves(per_step, steps, checkpoints)
    for backend, searched in measured.search.items():  # units sizes cannot bound: the measured value is the range
        for target in (bounds.step_low, bounds.step_high):
            target.searched(backend)
        for unit in ("input_tokens", "cache_read_input_tokens", "output_tokens", "web_searches", "quota_units",
                     "http_requests"):
            value = getattr(searched, unit)
            if value and not getattr(bounds.step_high.searched(backend), unit):
                calls = searched.calls or 1
                high_calls = bounds.step_high.searched(backend).calls
                setattr(bounds.step_high.searched(backend), unit, value / calls * high_calls)
                setattr(bounds.run_high.searched(backend), unit, value / calls * high_calls * steps)
    bounds.notes = [note for note in bounds.notes if "--estimate-measure" not in note]
    bounds.notes.append("projection: the measured step times the number of steps (later steps change as the "
                        "policy learns)")
    if offline:
        bounds.notes.append(TWIN_NOTE)
    return bounds


def _number(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.4g}" if value != int(value) else f"{int(value)}"


def render_estimate(estimate: Estimate, prices: PriceTable | None = None) -> str:
    """The estimate as a table: per step and for the run, low-high (and measured / projected)."""
    kinds = sorted(set(estimate.step_high.kinds()) | set(estimate.step_low.kinds())
                   | set((estimate.step_measured or Usage()).kinds()), key=_kind_order)
    rows = [("kind", "per step", "measured", f"run ({plural(estimate.steps, 'step')})", "projected")]

    def pick(usage: Usage | None, kind: str) -> float:
        return 0.0 if usage is None else float(usage.kinds().get(kind, 0))

    for kind in kinds:
        values = [pick(u, kind) for u in (estimate.step_high, estimate.step_measured)]
        unbounded = kind.startswith("search_") and not kind.endswith(("_calls", "_requests"))
        if not any(values) and not unbounded:
            continue  # nothing of this kind in this run (e.g. KL without --kl-coef)
        if not any(values):
            rows.append((kind, "?", "", "?", ""))
            continue
        rows.append((kind, f"{_number(pick(estimate.step_low, kind))}-{_number(pick(estimate.step_high, kind))}",
                     _number(pick(estimate.step_measured, kind)) if estimate.step_measured else "",
                     f"{_number(pick(estimate.run_low, kind))}-{_number(pick(estimate.run_high, kind))}",
                     _number(pick(estimate.run_projected, kind)) if estimate.run_projected else ""))
    if prices is not None:
        def cost(usage: Usage | None) -> str:
            return "" if usage is None else f"{prices.cost(usage):.4f}"

        rows.append((f"cost ({prices.currency})", f"{cost(estimate.step_low)}-{cost(estimate.step_high)}",
                     cost(estimate.step_measured), f"{cost(estimate.run_low)}-{cost(estimate.run_high)}",
                     cost(estimate.run_projected)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    keep = [i for i in range(len(widths)) if any(row[i] for row in rows[1:])]
    lines = ["estimate (nothing was sampled for the ranges):"]
    lines += ["  " + "  ".join(row[i].ljust(widths[i]) for i in keep).rstrip() for row in rows]
    lines += [f"note: {note}" for note in estimate.notes]
    return "\n".join(lines)


def _kind_order(kind: str) -> tuple[int, str]:
    order = [f.name for f in fields(Usage) if f.name not in ("search", "tools")]
    return (order.index(kind), kind) if kind in order else (len(order), kind)

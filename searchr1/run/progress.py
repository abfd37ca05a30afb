"""What long work prints while it runs.

On a terminal: rich progress bars (steps, the current step's trajectories) and one summary
line per step, cut to the terminal's width so it never wraps. Anywhere else (a log file, a
pipe, CI) and with ``--quiet``: no bars, just one plain line per step and the notes, written
whole so that each step stays one line of the log. :func:`make_reporter` picks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from searchr1.basics.wording import plural

FIELD_SEPARATOR = "  "


@dataclass(frozen=True)
class Field:
    text: str
    rank: int  # 0 is kept longest; higher ranks are dropped first when the line is too wide


def step_fields(step: int, metrics: dict[str, float]) -> list[Field]:
    """The pieces of a step line in reading order, each ranked by how much it matters."""
    loss = metrics.get("trainer/loss_mean")
    loss_text = "skipped" if metrics.get("train/update_skipped") else ("n/a" if loss is None else f"{loss:+.4f}")
    return [
        Field(f"step {step:>4}", 0),
        Field(f"{metrics.get('time/step_seconds', 0.0):6.1f}s", 5),
        Field(f"loss {loss_text}", 3),
        Field(f"reward {metrics.get('reward/mean', 0.0):+.3f}", 1),
        Field(f"correct {metrics.get('reward/correct', 0.0):.3f}", 2),
        Field(f"format {metrics.get('reward/format', 0.0):.3f}", 4),
        Field(f"searches {metrics.get('rollout/search_calls', 0.0):.2f}", 6),
        Field(f"degenerate {metrics.get('rollout/degenerate_group_rate', 0.0):.2f}", 7),
        Field(f"datums {int(metrics.get('train/datums_per_rollout_batch', 0))}", 8),
        Field(f"tokens {int(metrics.get('train/tokens_sent', 0))}", 9),
        *([Field(f"entropy {metrics['health/entropy']:.3f}", 10)] if "health/entropy" in metrics else []),
        *([Field(f"k3 {metrics['health/mismatch_k3']:.2g}", 11)] if "health/mismatch_k3" in metrics else []),
        *([Field("UNHEALTHY", 2)] if metrics.get("health/unhealthy") else []),
        # the run so far (searchr1.run.usage, searchr1.run.costs)
        *([Field(f"run {_thousands(metrics['usage/total_model_tokens'])} tok", 3)]
          if "usage/total_model_tokens" in metrics else []),
        *([Field(f"spent {metrics['cost/total']:.2f}", 3)] if "cost/total" in metrics else []),
    ]


def _thousands(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def fit_line(fields: Sequence[Field], width: int | None) -> str:
    """The fields joined in order; when wider than ``width``, the highest-ranked fields are
    left out until it fits (the rank-0 field stays, cut with ``…`` if even it is too wide).
    ``None`` means no limit."""
    kept = list(fields)
    line = FIELD_SEPARATOR.join(f.text for f in kept)
    if width is None:
        return line
    while len(line) > width and len(kept) > 1:
        kept.remove(max((f for f in kept if f.rank > 0), key=lambda f: f.rank, default=kept[-1]))
        line = FIELD_SEPARATOR.join(f.text for f in kept)
    if len(line) > width:
        line = line[: max(width - 1, 0)] + "…" if width > 0 else ""
    return line


def step_summary(step: int, metrics: dict[str, float], width: int | None = None) -> str:
    return fit_line(step_fields(step, metrics), width)


def nothing_to_do(total_steps: int, first_step: int) -> str | None:
    """What to say when a resumed run has already reached ``--max-steps``."""
    if first_step < total_steps:
        return None
    return (f"nothing to run: {plural(first_step, 'step')} already finished and --max-steps is {total_steps}; "
            "raise --max-steps to train further")


class LineReporter:
    """The trainer's :class:`~searchr1.run.reporting.Reporter` for logs and ``--quiet``: one plain
    line per step and the notes; no bars. ``width`` cuts step lines (a terminal's width), None
    keeps them whole."""

    def __init__(self, stream: IO[str] | None = None, width: int | None = None) -> None:
        self._stream = stream
        self.width = width

    def _print(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()

    def start(self, total_steps: int, first_step: int) -> None:
        message = nothing_to_do(total_steps, first_step)
        if message:
            self._print(message)

    def start_step(self, step: int, trajectories: int) -> None: ...

    def trajectory_done(self, count: int = 1) -> None: ...

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        self._print(step_summary(step, metrics, self.width))

    def note(self, text: str) -> None:
        self._print(text)

    def close(self) -> None: ...


class RichReporter:
    """The trainer's :class:`~searchr1.run.reporting.Reporter` on a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self._steps: TaskID | None = None
        self._trajectories: TaskID | None = None

    def start(self, total_steps: int, first_step: int) -> None:
        message = nothing_to_do(total_steps, first_step)
        if message:
            self.console.print(message, markup=False, highlight=False)
        self.progress.start()
        self._steps = self.progress.add_task("steps", total=total_steps, completed=min(first_step, total_steps))

    def start_step(self, step: int, trajectories: int) -> None:
        if self._trajectories is not None:
            self.progress.remove_task(self._trajectories)
        self._trajectories = self.progress.add_task(f"step {step} rollouts", total=trajectories)

    def trajectory_done(self, count: int = 1) -> None:
        if self._trajectories is not None:
            self.progress.advance(self._trajectories, count)

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        assert self._steps is not None, "end_step before start"
        self.progress.advance(self._steps)
        self.progress.console.print(step_summary(step, metrics, self.console.width), markup=False,
                                    highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop()


def make_reporter(*, quiet: bool = False, console: Console | None = None) -> RichReporter | LineReporter:
    """Bars and fitted lines on a terminal; plain whole lines elsewhere; with ``quiet``, the
    step lines only (fitted on a terminal)."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        return LineReporter(stream=console.file, width=None)
    if quiet:
        return LineReporter(stream=console.file, width=console.width)
    return RichReporter(console)


class CountingBar:
    """A single progress bar for a known amount of work (eval, record, rollout); silent when
    the console is not a terminal, where a bar would only leave its last frame in the log."""

    def __init__(self, description: str, total: int, console: Console | None = None) -> None:
        console = console or Console(stderr=True)
        self.progress: Progress | None = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console,
            )
            self.task = self.progress.add_task(description, total=total)

    def __enter__(self) -> CountingBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def advance(self, count: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, count)

    def __exit__(self, *exc_info: object) -> None:
        if self.progress is not None:
            self.progress.stop()

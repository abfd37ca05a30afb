"""Progress display for long work (rich): steps, trajectories of the current step, and one
summary line per step."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def step_summary(step: int, metrics: dict[str, float]) -> str:
    loss = metrics.get("trainer/loss_mean")
    loss_text = "skipped" if metrics.get("train/update_skipped") else ("n/a" if loss is None else f"{loss:+.4f}")
    return (
        f"step {step:>4}  {metrics.get('time/step_seconds', 0.0):6.1f}s  loss {loss_text}  "
        f"reward {metrics.get('reward/mean', 0.0):+.3f}  correct {metrics.get('reward/correct', 0.0):.3f}  "
        f"format {metrics.get('reward/format', 0.0):.3f}  searches {metrics.get('rollout/search_calls', 0.0):.2f}  "
        f"degenerate {metrics.get('rollout/degenerate_group_rate', 0.0):.2f}  "
        f"datums {int(metrics.get('train/datums_per_rollout_batch', 0))}  "
        f"tokens {int(metrics.get('train/tokens_sent', 0))}"
    )


class RichReporter:
    """The trainer's :class:`~searchr1.trainer.Reporter` on a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self._steps: Any = None
        self._trajectories: Any = None

    def start(self, total_steps: int, first_step: int) -> None:
        self.progress.start()
        self._steps = self.progress.add_task("steps", total=total_steps, completed=first_step)

    def start_step(self, step: int, trajectories: int) -> None:
        if self._trajectories is not None:
            self.progress.remove_task(self._trajectories)
        self._trajectories = self.progress.add_task(f"step {step} rollouts", total=trajectories)

    def trajectory_done(self, count: int = 1) -> None:
        if self._trajectories is not None:
            self.progress.advance(self._trajectories, count)

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        self.progress.advance(self._steps)
        self.progress.console.print(step_summary(step, metrics))

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def close(self) -> None:
        self.progress.stop()


class CountingBar:
    """A single progress bar for a known amount of work (eval, record, rollout)."""

    def __init__(self, description: str, total: int, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self.task = self.progress.add_task(description, total=total)

    def __enter__(self) -> CountingBar:
        self.progress.start()
        return self

    def advance(self, count: int = 1) -> None:
        self.progress.advance(self.task, count)

    def __exit__(self, *exc_info: object) -> None:
        self.progress.stop()

"""What the training loop reports to, as interfaces: the progress display (bars on a terminal or
one line per step: :mod:`searchr1.run.progress`) and the dashboards (:mod:`searchr1.run.loggers`)."""

from __future__ import annotations

from typing import Protocol


class MetricsLogger(Protocol):
    """Where each finished step's metrics also go (SwanLab, W&B, TensorBoard)."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...


class Reporter(Protocol):
    def start(self, total_steps: int, first_step: int) -> None: ...
    def start_step(self, step: int, trajectories: int) -> None: ...
    def trajectory_done(self, count: int = 1) -> None: ...
    def end_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


class SilentReporter:
    """A :class:`Reporter` that shows nothing (tests, benchmarks)."""

    def start(self, total_steps: int, first_step: int) -> None:
        pass

    def start_step(self, step: int, trajectories: int) -> None:
        pass

    def trajectory_done(self, count: int = 1) -> None:
        pass

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

"""Where a training run's per-step metrics go besides ``metrics.jsonl``: SwanLab, Weights &
Biases and TensorBoard, chosen with ``train --logger NAME`` (repeatable; ``none`` for none).

Every writer has the same two methods, ``log(step, metrics)`` and ``finish()``, and the
trainer sees one :class:`Loggers` that calls each of them. The packages are optional extras
(``pip install 'searchr1[wandb]'``) imported only when chosen; :func:`check_available` tells,
before any work starts, which chosen one is missing, in one line. A writer that fails while the
run goes on (its service unreachable, its disk full) is reported once and dropped: the metrics
are safe in ``metrics.jsonl``, and a dashboard must never stop a paid training run.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from searchr1.core.errors import UserError

NONE = "none"
LOGGER_NAMES = ("swanlab", "wandb", "tensorboard")
# logger -> (module to import, pip extra that installs it)
PACKAGES = {
    "swanlab": ("swanlab", "swanlab"),
    "wandb": ("wandb", "wandb"),
    "tensorboard": ("tensorboardX", "tensorboard"),
}
SWANLAB_MODES = ("auto", "online", "local", "offline", "disabled")
TENSORBOARD_DIR = "tensorboard"


class LoggerSetupError(UserError, ValueError):
    """A --logger choice that cannot work; the message names the flag and the fix."""


class MetricsLogger(Protocol):
    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def finish(self) -> None: ...


@dataclass(frozen=True)
class LoggerSettings:
    """What the writers are told about the run."""

    run_name: str
    run_dir: Path
    config: Mapping[str, object] = field(default_factory=dict)
    project: str = "searchr1"
    swanlab_mode: str | None = None  # passed to swanlab.init when set


# --- choosing ----------------------------------------------------------------------------


def resolve_loggers(
    requested: Sequence[str],
    *,
    offline: bool,
    swanlab_mode: str = "auto",
    installed: Callable[[str], bool] | None = None,
) -> list[str]:
    """The writers to open, in the order given, without repeats.

    With no ``--logger`` the older ``--swanlab-mode`` decides, as it always did: ``auto`` logs
    to SwanLab on live runs when swanlab is installed, ``disabled`` logs nowhere, any other mode
    logs to SwanLab. ``none`` cannot be combined with a writer."""
    installed = installed or is_installed
    chosen = list(dict.fromkeys(requested))
    if NONE in chosen and len(chosen) > 1:
        others = ", ".join(n for n in chosen if n != NONE)
        raise LoggerSetupError(f"--logger none contradicts --logger {others}")
    unknown = [n for n in chosen if n != NONE and n not in LOGGER_NAMES]
    if unknown:
        raise LoggerSetupError(f"--logger {unknown[0]} is not one of {', '.join((NONE, *LOGGER_NAMES))}")
    if swanlab_mode not in SWANLAB_MODES:
        raise LoggerSetupError(f"--swanlab-mode {swanlab_mode} is not one of {', '.join(SWANLAB_MODES)}")
    if chosen:
        if swanlab_mode == "disabled" and "swanlab" in chosen:
            raise LoggerSetupError("--logger swanlab contradicts --swanlab-mode disabled")
        return [n for n in chosen if n != NONE]
    if swanlab_mode == "disabled":
        return []
    if swanlab_mode == "auto":
        return ["swanlab"] if not offline and installed("swanlab") else []
    return ["swanlab"]


def is_installed(name: str) -> bool:
    """Whether the package behind logger ``name`` can be imported (without importing it)."""
    module = PACKAGES[name][0]
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_available(names: Sequence[str], *, installed: Callable[[str], bool] | None = None) -> None:
    """Raise one line naming the first chosen writer whose package is missing, and how to get it."""
    installed = installed or is_installed
    for name in names:
        if name not in PACKAGES:
            raise LoggerSetupError(f"--logger {name} is not one of {', '.join((NONE, *LOGGER_NAMES))}")
        if not installed(name):
            module, extra = PACKAGES[name]
            raise LoggerSetupError(
                f"--logger {name} needs the {module} package, which is not installed: "
                f"pip install 'searchr1[{extra}]' (or choose another --logger)"
            )


# --- the writers -------------------------------------------------------------------------


def numeric(metrics: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of a metrics line (dashboards reject NaN, strings and None)."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


class SwanLabWriter:
    name = "swanlab"

    def __init__(self, settings: LoggerSettings) -> None:
        self._swanlab = importlib.import_module("swanlab")
        options: dict[str, object] = {"project": settings.project, "experiment_name": settings.run_name,
                                   "config": dict(settings.config)}
        if settings.swanlab_mode and settings.swanlab_mode != "auto":
            options["mode"] = settings.swanlab_mode
        self._run = self._swanlab.init(**options)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._swanlab.log(numeric(metrics), step=step)

    def finish(self) -> None:
        self._run.finish()


class WandbWriter:
    name = "wandb"

    def __init__(self, settings: LoggerSettings) -> None:
        wandb = importlib.import_module("wandb")
        self._run = wandb.init(project=settings.project, name=settings.run_name, config=dict(settings.config),
                               dir=str(settings.run_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(numeric(metrics), step=step)

    def finish(self) -> None:
        self._run.finish()


class TensorBoardWriter:
    """Event files under ``<run_dir>/tensorboard`` (``tensorboard --logdir`` that folder),
    flushed after every step so that a crash keeps the finished ones."""

    name = "tensorboard"

    def __init__(self, settings: LoggerSettings) -> None:
        tensorboard = importlib.import_module("tensorboardX")
        self._writer = tensorboard.SummaryWriter(logdir=str(settings.run_dir / TENSORBOARD_DIR))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in numeric(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


WRITERS: dict[str, Callable[[LoggerSettings], MetricsLogger]] = {
    "swanlab": SwanLabWriter,
    "wandb": WandbWriter,
    "tensorboard": TensorBoardWriter,
}


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class FanOut:
    """Every chosen writer behind one ``log``/``finish`` (also callable as ``fan_out(step,
    metrics)``, the trainer's logger signature). A writer that raises is reported once through
    ``warn`` and not called again; the others go on."""

    def __init__(self, writers: Sequence[MetricsLogger], *, warn: Callable[[str], None] = _warn) -> None:
        self.writers = list(writers)
        self._warn = warn

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.writers]

    def _drop(self, writer: MetricsLogger, doing: str, error: BaseException) -> None:
        self.writers = [w for w in self.writers if w is not writer]
        detail = str(error).splitlines()[0][:200] if str(error) else ""
        self._warn(f"warning: the {writer.name} logger failed while {doing} ({type(error).__name__}"
                   f"{': ' + detail if detail else ''}); it is switched off, metrics.jsonl keeps every step")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for writer in list(self.writers):
            try:
                writer.log(step, metrics)
            except Exception as error:  # noqa: BLE001 - a dashboard must not stop training
                self._drop(writer, f"logging step {step}", error)

    __call__ = log

    def finish(self) -> None:
        for writer in list(self.writers):
            try:
                writer.finish()
            except Exception as error:  # noqa: BLE001
                self._drop(writer, "finishing", error)
        self.writers = []


class Loggers(FanOut):
    """The writers a run asked for: checked when made (a missing package raises before any work),
    started by :meth:`start` once the run directory exists (TensorBoard and W&B write into it)."""

    def __init__(self, names: Sequence[str], settings: LoggerSettings, *,
                 warn: Callable[[str], None] = _warn) -> None:
        check_available(names)
        super().__init__([], warn=warn)
        self.planned = list(names)
        self.settings = settings

    def start(self) -> Loggers:
        """Start every writer. One that cannot start raises LoggerSetupError naming it (after
        finishing the ones already started): nothing has been trained yet."""
        for name in self.planned:
            try:
                self.writers.append(WRITERS[name](self.settings))
            except Exception as error:
                self.finish()
                detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                raise LoggerSetupError(f"--logger {name} could not start: {detail}") from None
        return self


def open_loggers(names: Sequence[str], settings: LoggerSettings, *,
                 warn: Callable[[str], None] = _warn) -> Loggers:
    """Check, then start, the chosen writers."""
    return Loggers(names, settings, warn=warn).start()

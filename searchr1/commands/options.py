"""Click options shared by the commands that roll out (train, eval, rollout)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..rollout import TOOL_OVERFLOW_MODES, RolloutConfig

ROLLOUT_OPTION_NAMES = (
    "group_size", "max_search_calls", "max_assistant_turns", "max_trajectory_tokens",
    "max_assistant_tokens", "max_tool_response_tokens", "temperature", "top_p",
    "sampling_concurrency", "sample_timeout", "sample_retries", "tool_overflow", "tool_description",
)


def _at_least(minimum: float) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value < minimum:
            raise click.BadParameter(f"must be >= {minimum}, got {value}")
        return value

    return check


def connect_timeout_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--connect-timeout``: how long to wait for PyTRIO to answer before naming the cause."""
    return click.option("--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
                        show_default=True, metavar="SECONDS",
                        help="Give up connecting to PyTRIO after this long and say why (no network, DNS, "
                             "refused); the run's own calls keep PyTRIO's retry windows.")


def _offline_fault(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    from ..twin.config import parse_offline_fault

    try:
        return parse_offline_fault(value)
    except ValueError as error:
        raise click.BadParameter(str(error).split(": ", 1)[-1], ctx=ctx, param=param) from None


def offline_fault_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--offline-fault collapse@N`` (train --offline and twin serve): from the N-th weight
    update on, the twin's sampler degenerates (searchr1.twin.collapse)."""
    return click.option(
        "--offline-fault", "offline_fault", default=None, metavar="collapse@N", callback=_offline_fault,
        help="A fault of the offline twin: collapse@N makes samplers on weights with N or more updates "
             "(from step N on) reply with one repetitive turn without an Answer: line, to try the "
             "collapse guard.")


def _group_size_for_training(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None and value < 2:
        raise click.BadParameter(
            f"{value}: group advantages compare a question's samples with each other, so a group of one "
            "always has advantage 0 and no step could ever update; use at least 2")
    return value


def rollout_options(*, group_size: int = 8, temperature: float = 1.0,
                    min_group_size: int = 1) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Budgets and sampling flags (the seed's names and defaults)."""
    options = [
        click.option("--group-size", type=int, default=group_size, show_default=True,
                     callback=_group_size_for_training if min_group_size >= 2 else _at_least(1),
                     help="Trajectories per question."),
        click.option("--max-search-calls", type=int, default=4, show_default=True, callback=_at_least(0),
                     help="Searches per trajectory."),
        click.option("--max-assistant-turns", type=int, default=6, show_default=True, callback=_at_least(1),
                     help="Assistant turns per trajectory."),
        click.option("--max-trajectory-tokens", type=int, default=8192, show_default=True, callback=_at_least(1),
                     help="Whole-sequence budget (also the training datum limit)."),
        click.option("--max-assistant-tokens", type=int, default=1024, show_default=True, callback=_at_least(1),
                     help="Generation cap per assistant turn."),
        click.option("--max-tool-response-tokens", type=int, default=1024, show_default=True, callback=_at_least(1),
                     help="Cap on one observation's content."),
        click.option("--temperature", type=float, default=temperature, show_default=True, callback=_at_least(0.0)),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True,
                     help="Nucleus sampling mass, in (0, 1]."),
        click.option("--sampling-concurrency", type=int, default=64, show_default=True, callback=_at_least(1),
                     help="Sampling requests in flight at once."),
        click.option("--sample-timeout", type=float, default=900.0, show_default=True, callback=_at_least(1.0),
                     help="Seconds before one sampling request is abandoned (then retried)."),
        click.option("--sample-retries", type=int, default=2, show_default=True, callback=_at_least(0),
                     help="Retries of a retryable sampling failure."),
        click.option("--tool-overflow", type=click.Choice(TOOL_OVERFLOW_MODES), default="truncate", show_default=True,
                     help="When even the first search item does not fit: truncate it (marked), or end the trajectory (seed)."),
        click.option("--system-prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None,
                     help="Use this file's text as the system prompt ({max_search_calls} in it becomes the search "
                          "budget) instead of the project's wording; recorded in config.json and eval summaries."),
        click.option("--tool-description", default=None, metavar="TEXT",
                     help="Description of the search tool shown to the model [default: the project's wording]."),
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def read_system_prompt(path: Path | None) -> str | None:
    """The text of ``--system-prompt-file`` (``None`` keeps the default wording)."""
    if path is None:
        return None
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise click.BadParameter(f"cannot read {path}: {error}", param_hint="--system-prompt-file") from None
    if not text.strip():
        raise click.BadParameter(f"{path} is empty", param_hint="--system-prompt-file")
    return text


def rollout_config_from(kwargs: dict[str, Any], *, seed: int) -> RolloutConfig:
    """Pop the rollout flags out of a command's kwargs into a :class:`RolloutConfig`."""
    values = {name: kwargs.pop(name) for name in ROLLOUT_OPTION_NAMES}
    values["system_prompt"] = read_system_prompt(kwargs.pop("system_prompt_file"))
    return RolloutConfig(seed=seed, **values)


def check_offline_group_size(policy: str | None, group_size: int) -> None:
    """The scripted offline scenario scripts 8 samples per question: a larger --group-size is a
    one-line error before anything starts (the learning policy has no such limit)."""
    if policy != "scripted":
        return
    from ..services import offline_scenario

    scripted = min(len(question.samples) for question in offline_scenario().questions)
    if group_size > scripted:
        raise click.BadParameter(f"{group_size} is more than the {scripted} samples per question the scripted "
                                 "offline scenario holds (use --offline-policy learning for larger groups)",
                                 param_hint="--group-size")


def run_guarded(function: Callable[[], Any]) -> Any:
    """Turn expected failures into one clear line and a non-zero exit (no traceback)."""
    from ..data import DataError
    from ..preflight import PreflightError
    from ..run_dir import RunDirError
    from ..search.base import SearchRefusedError
    from ..search.env import MissingApiKeyError
    from ..search.replay import CassetteFormatError, CassetteMissError
    from ..services import ServiceSetupError
    from ..tokenizer import TokenizerSetupError
    from ..twin.scenario import ScenarioError

    expected = (DataError, PreflightError, RunDirError, ScenarioError, MissingApiKeyError, SearchRefusedError,
                CassetteMissError, CassetteFormatError, ServiceSetupError, TokenizerSetupError, FileNotFoundError)
    try:
        return function()
    except expected as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        raise click.ClickException("interrupted") from None



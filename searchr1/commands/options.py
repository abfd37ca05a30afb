"""Click options shared by the commands that roll out (train, eval, rollout)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import click

from searchr1.core.errors import UserError
from searchr1.basics.fileio import is_write_failure, write_failure_line
from searchr1.core.rollout import RolloutConfig
from searchr1.commands.help_layout import SectionOption
from searchr1.core.settings import OnResume
from searchr1.offline import OfflinePolicy
from searchr1.commands.settings_options import (F, FiniteFloatRange, call_with, pop_optional,
                                                preset_origin, setting_options, take_settings)

T = TypeVar("T")


def connect_timeout_option() -> Callable[[F], F]:
    """``--connect-timeout``: how long to wait for PyTRIO to answer before naming the cause."""
    return click.option("--connect-timeout", type=FiniteFloatRange(min=0, min_open=True), default=30.0,
                        show_default=True, metavar="SECONDS", cls=SectionOption, section="service",
                        on_resume=OnResume.FREE,
                        help="Give up connecting to PyTRIO after this long and say why (no network, DNS, "
                             "refused); the run's own calls keep PyTRIO's retry windows.")


def _offline_fault(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from searchr1.twin.config import offline_fault_text, parse_offline_fault

    try:
        parsed = parse_offline_fault(value)
    except ValueError as error:
        raise click.BadParameter(str(error).split(": ", 1)[-1], ctx=ctx, param=param) from None
    return offline_fault_text(parsed)  # one spelling, as recorded


def offline_fault_option() -> Callable[[F], F]:
    """``--offline-fault collapse@N|mismatch@SCALE|none`` (train --offline and twin serve): from
    the N-th weight update on, the twin's sampler degenerates (searchr1.twin.collapse); or the
    learning policy's sampler differs from its learner (searchr1.twin.mismatch). The value is the
    canonical text (``collapse@N``, ``mismatch@SCALE`` or ``none``), or None when the flag is not given."""
    return click.option(
        "--offline-fault", "offline_fault", default=None, metavar="collapse@N|mismatch@SCALE|none",
        callback=_offline_fault, cls=SectionOption, section="service", on_resume=OnResume.FREE,
        help="A fault of the offline twin: collapse@N makes samplers on weights with N or more updates "
             "(from step N on) reply with one repetitive turn without an Answer: line, to try the "
             "collapse guard; mismatch@SCALE makes the learning policy's sampler add a fixed noise of "
             "standard deviation SCALE to each candidate turn's logit, as a low-precision inference "
             "engine differs from the learner, to try --correction. train records it in config.json "
             "and --resume keeps it; none clears it.")


def rollout_options(*, group_size: int = 8, temperature: float = 1.0, helps: dict[str, str] | None = None,
                    exclude: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Budgets and sampling flags, made from :class:`RolloutConfig`'s declarations (the lab port's
    names and defaults; a command may start from others, e.g. eval's greedy sampling, say more
    about a flag in ``helps``, and leave out, in ``exclude``, the settings it fixes itself)."""
    declared = setting_options(RolloutConfig, defaults={"group_size": group_size, "temperature": temperature},
                               helps=helps, section="rollout", exclude=exclude)
    system_prompt_file = click.option(
        "--system-prompt-file", cls=SectionOption, section="rollout", on_resume=OnResume.FIXED,
        recorded_as="system_prompt",
        type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
        help="Use this file's text as the system prompt ({max_search_calls} in it becomes the search "
             "budget) instead of the project's wording; recorded in config.json and eval summaries.")

    def decorate(command: F) -> F:
        return declared(system_prompt_file(command))

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


def rollout_config_from(kwargs: dict[str, object], *, seed: int, **fixed: object) -> RolloutConfig:
    """Pop the rollout flags out of a command's kwargs into a :class:`RolloutConfig`; ``fixed``
    holds the settings the command left out of its flags (``rollout_options(exclude=...)``)."""
    values = take_settings(RolloutConfig, kwargs, exclude=tuple(fixed))
    values["system_prompt"] = read_system_prompt(pop_optional(kwargs, "system_prompt_file", Path))
    return call_with(RolloutConfig, {"seed": seed, **values, **fixed})


def check_offline_group_size(policy: str | None, group_size: int) -> None:
    """The scripted offline scenario scripts 8 samples per question: a larger --group-size is a
    one-line error before anything starts (the learning policy has no such limit)."""
    if policy != OfflinePolicy.SCRIPTED:
        return
    from searchr1.wiring.services import offline_scenario

    scripted = min(len(question.samples) for question in offline_scenario().questions)
    if group_size > scripted:
        raise click.BadParameter(f"{group_size} is more than the {scripted} samples per question the scripted "
                                 "offline scenario holds (use --offline-policy learning for larger groups)",
                                 param_hint="--group-size")


INTERRUPTED_NOTE = "searchr1.interrupted"  # click's ctx.meta key of what a Ctrl-C would interrupt


def on_interrupt(message: str) -> None:
    """From here on, a Ctrl-C that reaches :func:`run_guarded` prints ``message``: what it
    interrupted, what is kept, how to go on (a command says so as its state changes)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[INTERRUPTED_NOTE] = message


def interrupted_message(ctx: click.Context | None) -> str:
    """What a Ctrl-C says: the command's own words (:func:`on_interrupt`), else which command
    was interrupted and that what it finished is kept (every file is written whole or not at
    all, ``basics/fileio.py``)."""
    if ctx is not None and ctx.meta.get(INTERRUPTED_NOTE):
        return str(ctx.meta[INTERRUPTED_NOTE])
    name = " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""
    return (f"{name or 'the command'} interrupted (Ctrl-C) before it finished; nothing it had finished "
            "is lost: run the same command again to continue")


def _preset_origins(ctx: click.Context | None, message: str) -> str:
    """``message`` with each of its lines that names a flag set by the ``--config`` preset
    naming the file and line too (a message may list several problems, a line each)."""
    return "\n".join(preset_origin(ctx, line) for line in message.split("\n"))


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within the block, SIGTERM (a service manager's stop, ``docker stop``) ends the command as an
    exception does, exit 143 (128 + 15): every ``with`` block it is in cleans up (a temporary
    folder, a search backend) instead of the process dying where it stands. A server that catches
    SIGTERM to shut down gracefully (uvicorn) raises it again once it has, and lands here."""
    def exit_on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_guarded(function: Callable[[], T]) -> T:
    """Turn expected failures (every :class:`UserError`, a missing file, a disk that cannot be
    written) into one clear line and a non-zero exit (no traceback). A line that names a flag set
    by the ``--config`` preset names the file and line too."""
    ctx = click.get_current_context(silent=True)
    try:
        return function()
    except UserError as error:
        message = _preset_origins(ctx, str(error))
        if error.exit_code == 2:
            raise click.UsageError(message) from None
        raise click.ClickException(message) from None
    except click.ClickException as error:  # a flag's value refused by a later check: name a preset it came from
        shown = error.format_message()
        # click declares ClickException.message Final; amended in place, the error keeps its class, hint and code
        error.message += preset_origin(ctx, shown)[len(shown):]  # type: ignore[misc]  # Final in click's types
        raise
    except FileNotFoundError as error:
        raise click.ClickException(str(error)) from None
    except OSError as error:
        if is_write_failure(error):  # a full, read-only or forbidden disk: the path and the cause
            raise click.ClickException(write_failure_line(error)) from None
        raise
    except KeyboardInterrupt:
        click.secho(interrupted_message(ctx), fg="yellow", err=True)
        sys.exit(130)  # the shell's code for SIGINT, as everywhere else



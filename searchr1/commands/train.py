"""``train``: Search-R1 training on PyTRIO, or on its offline twin."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import sys
import time
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

import click

from searchr1 import __version__
from searchr1.run.loggers import LOGGER_NAMES, SWANLAB_MODES
from searchr1.run.algorithm import parse_loss_fn_config
from searchr1.core.rollout import RolloutConfig
from searchr1.basics import invocation
from searchr1.basics.json_types import JsonObject, JsonValue, as_float, as_list
from searchr1.commands.search_options import search_options
from searchr1.search.options import SearchOptions
from searchr1.offline import OFFLINE_POLICIES, TRAIN, OfflinePolicy
from searchr1.training.config import TrainConfig
from searchr1.core.settings import OnResume, offline_defaults
from searchr1.commands.options import (
    check_offline_group_size,
    connect_timeout_option,
    offline_fault_option,
    on_interrupt,
    rollout_config_from,
    rollout_options,
    run_guarded,
)
from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.run_record import (
    RUN_RECORD,
    RunRecord,
    command_line_params,
    read_run_record,
    record_warnings,
    same_directory,
    with_unflagged,
)
from searchr1.commands.settings_options import (
    call_with,
    config_file_option,
    flag_value,
    given_params,
    pop_flag,
    pop_optional,
    setting_options,
    setting_params,
    take_settings,
)

if TYPE_CHECKING:
    import signal
    from types import FrameType

    import pytrio

    from searchr1.commands.prerequisites import Prerequisites
    from searchr1.core.types import SearchExample
    from searchr1.evaluation.judge import Judge
    from searchr1.runtime.tokenizer import Qwen35Tokenizer
    from searchr1.run.costs import RunAccount
    from searchr1.run.directory import ResumePoint, RunDir
    from searchr1.run.loggers import Loggers
    from searchr1.training.loop import TrainingRun

T = TypeVar("T")

# Exit code of a run stopped by --stop-on-collapse.
COLLAPSE_EXIT_CODE = 3
# Exit code of a run stopped by --budget / --budget-tokens (a checkpoint of every finished step is saved).
BUDGET_EXIT_CODE = 4
# The settings --help lists first, in this order, where the run's (TrainConfig's) and the core step's
# (StepConfig's) share a section; any other setting follows in declaration order.
@click.command(cls=SectionedCommand, context_settings={"show_default": True})
@config_file_option(read_record=read_run_record)
@click.option("--offline-policy", type=click.Choice(OFFLINE_POLICIES), default=OfflinePolicy.LEARNING.value,
              cls=SectionOption, section="service", on_resume=OnResume.FIXED,
              help="With --offline: the policy the twin serves. learning: a small model over whole assistant "
                   "turns that really improves from the updates; scripted: the fixed scenario of the golden "
                   "tests (8 samples per question, so --group-size at most 8).")
@click.option("--offline", cls=SectionOption, section="run", on_resume=OnResume.FIXED, is_flag=True,
              help="No key, no network: the offline PyTRIO twin (the real client against a server on "
                   "127.0.0.1) and search cassettes.")
@setting_options(TrainConfig, defaults={"max_steps": None, "data": None}, section="algorithm")
@rollout_options(helps={"group_size": "Trajectories per question; training needs at least 2 (advantages compare "
                                      "a question's samples with each other)."})
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              cls=SectionOption, section="run", on_resume=OnResume.FIXED,
              help="Where config, metrics and checkpoints go [default: runs/<run-name>, or -2, -3… if taken].")
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path), default=None,
              cls=SectionOption, section="run", on_resume=OnResume.FREE,
              help="Continue the run in this directory from its last checkpoint (same data order, optimizer state).")
@click.option("--from-step", type=click.IntRange(min=0), default=None, metavar="K",
              cls=SectionOption, section="run", on_resume=OnResume.FREE,
              help="With --resume: restart from the checkpoint of step K instead of the last one. Later metrics, "
                   "transcripts and checkpoints are moved aside (*.rewound.jsonl), and algorithm flags "
                   "(--learning-rate, --advantage, ...) may change; config.json records them as a new segment.")
@click.option("--health-rule", "health_rules", multiple=True, metavar="NAME=VALUE",
              cls=SectionOption, section="health", on_resume=OnResume.GUARD,
              help="Change a health rule's threshold (NAME=off turns it off); repeatable. Rules and defaults: "
                   "format_valid_rate<0.1, answer_rate<0.1, entropy<0.0001 (only while reward or format falls), "
                   "mismatch_k3>0.1, repeated_turns>0.5, "
                   "reward_drop>0.5 (docs/health.md).")
@offline_fault_option()
@click.option("--loss-fn-config", multiple=True, metavar="KEY=VALUE",
              cls=SectionOption, section="algorithm", on_resume=OnResume.SEGMENT,
              help="Sent to forward_backward as loss_fn_config (repeatable; numbers parsed), e.g. "
                   "clip_low_threshold=0.8 clip_high_threshold=1.28 for ppo/cispo, beta=0.05 for dro.")
@click.option("--logger", "logger", multiple=True, type=click.Choice(["none", *LOGGER_NAMES]),
              cls=SectionOption, section="logging", on_resume=OnResume.FREE,
              help="Also send each step's metrics to swanlab, wandb or tensorboard (<run-dir>/tensorboard); "
                   "repeatable; none for none [default: swanlab on live runs when it is installed, else none]. "
                   "metrics.jsonl is always written.")
@click.option("--logger-project", "--swanlab-project", "logger_project", default="searchr1",
              cls=SectionOption, section="logging", on_resume=OnResume.FREE,
              help="SwanLab / W&B project (--swanlab-project is the old name).")
@click.option("--swanlab-mode", type=click.Choice(SWANLAB_MODES), default="auto",
              cls=SectionOption, section="logging", on_resume=OnResume.FREE,
              help="SwanLab's mode; any but auto and disabled implies --logger swanlab (older flag, kept working).")
@click.option("--chat-template", type=click.Path(dir_okay=False), default=None,
              cls=SectionOption, section="service", on_resume=OnResume.FREE,
              help="Another copy of the Qwen3.5 chat template (checked by sha256).")
@click.option("--quiet", is_flag=True, cls=SectionOption, section="logging", on_resume=OnResume.FREE,
              help="No progress bars; one line per step.")
@connect_timeout_option()
@click.option("--preflight-only", is_flag=True,
              cls=SectionOption, section="service", on_resume=OnResume.FREE,
              help="Run the checks a paid run makes before its first sample (server limits, the service's "
                   "tokenizer), print what they found and exit 0 when the run is ready; nothing is written.")
@click.option("--clamp-to-server-limits", is_flag=True,
              cls=SectionOption, section="service", on_resume=OnResume.FREE,
              help="Lower --max-trajectory-tokens to the service's limits for the model (with a warning) "
                   "instead of stopping.")
@click.option("--allow-tempered-sampling", is_flag=True,
              cls=SectionOption, section="rollout", on_resume=OnResume.FREE,
              help="Accept --temperature/--top-p other than 1. The importance ratio then uses logprobs of a "
                   "tempered or truncated distribution instead of the trained policy's, which biases the update.")
@click.option("--estimate", is_flag=True,
              cls=SectionOption, section="cost", on_resume=OnResume.FREE,
              help="Print what the whole run would use (tokens, requests and, with --prices, cost; per step and in "
                   "total, with a range) from the configured sizes, and exit; nothing is sampled or written.")
@click.option("--estimate-measure", is_flag=True,
              cls=SectionOption, section="cost", on_resume=OnResume.FREE,
              help="With --estimate: also run ONE real step (paid on a live run) in a temporary directory and "
                   "project the run from what it used.")
@search_options(default_backend="deepseek")
@click.pass_context
def train(ctx: click.Context, search: SearchOptions, **kwargs: object) -> None:
    """Train a search policy with GRPO-style group advantages and importance sampling.

    \b
    Live:     %(prog)s train --backend zhihu --max-steps 200
              (needs PYTRIO_API_KEY, and ZHIHU_SEARCH_KEYS / DEEPSEEK_API_KEY for those backends)
    Offline:  %(prog)s train --offline
    Resume:   %(prog)s train --resume runs/<run-name> [--max-steps N]

    Each step writes one line to <run-dir>/metrics.jsonl; checkpoints go to checkpoints.jsonl
    (their weights URI is what `eval --model-path` takes).
    """
    with contextlib.ExitStack() as held:  # the run directory's lock, for the life of the command
        run_guarded(lambda: _train(ctx, search, kwargs, held))


@dataclasses.dataclass(frozen=True)
class _RunFlags:
    """``train``'s flags that say how this command runs, not what the run is."""

    resume_dir: Path | None
    quiet: bool
    swanlab_mode: str
    logger_project: str
    loggers: tuple[str, ...]
    chat_template: str | None
    preflight_only: bool
    clamp: bool
    connect_timeout: float | None
    from_step: int | None
    offline_fault: str | None
    health_rules: dict[str, float | None]
    estimate: bool
    measure: bool

    @property
    def resuming(self) -> bool:
        return self.resume_dir is not None


@dataclasses.dataclass(frozen=True)
class _Start:
    """The run this command starts or continues: its settings, directory and search flags. A
    resume also carries config.json as recorded with this resume's changes (``stored``), the
    segment it starts (a restart from step K, or guard flags changed) and whether it brings
    another price table or budget."""

    config: TrainConfig
    run: RunDir
    search: SearchOptions
    stored: JsonObject = dataclasses.field(default_factory=dict)
    segment: Segment | None = None
    costs_changed: bool = False


class _Missing(enum.Enum):
    """What ``_stored_value`` gives for a flag config.json does not record."""

    MISSING = "missing"


_MISSING = _Missing.MISSING

# A setting a resume changes: its value in config.json before, and the one given now ("from" is a
# keyword, hence the functional form).
Change = TypedDict("Change", {"from": "JsonValue | _Missing", "to": "JsonValue"})


class Segment(TypedDict):
    """What a resume changed from a step on (config.json's ``segments`` record each, with the step
    it started at and its time)."""

    from_step: int | None
    changed: dict[str, Change]


def _train(ctx: click.Context, search: SearchOptions, kwargs: dict[str, object], held: contextlib.ExitStack) -> None:
    """A resumed or a new run, every check that bad input can fail, then its steps (or the
    estimate of them) and what they left."""
    from searchr1.commands.prerequisites import Prerequisites
    from searchr1.wiring.services import load_tokenizer

    explicit = given_params(ctx)  # on the command line or in the --config preset
    checks = Prerequisites()  # what is missing is said all at once, before the tokenizer loads
    flags = _run_flags(kwargs)
    try:
        kwargs["loss_fn_config"] = parse_loss_fn_config(flag_value(kwargs, "loss_fn_config", tuple))
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    record: RunRecord | None = ctx.meta.get(RUN_RECORD)  # --config RUN: a new run with that run's settings
    if flags.resume_dir is not None:
        start = _resumed_run(ctx, flags, kwargs, explicit, record, search, checks, held)
    else:
        start = _new_run(ctx, flags, kwargs, explicit, record, search, checks)
    # Everything bad input can break, before PyTRIO is contacted and before a new run
    # directory is written. First what needs no tokenizer, every failure said together: the
    # data, the price table, the search setup and keys, the loggers, the run directory, the
    # PyTRIO key and whether its host refuses connections. Then the whole data file (a
    # malformed line names file:line), the tokenizer and chat template; then the PyTRIO
    # connection, the server's limits and its tokenizer (searchr1.runtime.preflight). Only then
    # is the run directory written.
    on_interrupt(_interrupted_in_start_up(start.run, resuming=flags.resuming))
    if not start.config.offline and flags.offline_fault is not None:
        raise click.UsageError("--offline-fault only applies to offline runs")
    if (start.config.offline_fault or "").startswith("mismatch@") and start.config.offline_policy != "learning":
        raise click.UsageError("--offline-fault mismatch@SCALE perturbs the learning policy's candidate turns; "
                               "it needs --offline-policy learning")
    found = checks.check(_run_account, start.config)
    measured_steps = start.config.max_steps  # the steps --estimate-measure projects its one step to
    if flags.estimate and flags.measure:
        start, flags = _one_measured_step(start, flags, held)
        found = checks.check(_run_account, start.config)
    loggers = _check_setup(start, flags, checks, held)
    checks.raise_failures("the run")
    account = found
    assert account is not None  # its check passed
    examples = _training_examples(start.config)
    tokenizer = load_tokenizer(flags.chat_template)
    if flags.estimate and not flags.measure:
        from searchr1.run.estimate import configured_estimate, render_estimate

        click.echo(render_estimate(configured_estimate(start.config, tokenizer, examples), account.prices))
        return
    service = _start_service(start, flags, tokenizer, held)
    start = dataclasses.replace(start, config=_fit_server_limits(service, start.config, clamp=flags.clamp,
                                                                 resuming=flags.resuming))
    completed, stop = _run_session(start, flags, service, tokenizer, examples, loggers, account)
    if flags.preflight_only:
        return
    if flags.estimate:
        from searchr1.run.estimate import configured_estimate, measured_estimate, render_estimate

        config = start.config
        click.echo(render_estimate(measured_estimate(start.run.metrics()[0], measured_steps, offline=config.offline,
                                                     bounds=configured_estimate(
                                                         dataclasses.replace(config, max_steps=measured_steps),
                                                         tokenizer, examples)), account.prices))
        return
    _report_finished(start, completed, stop)


def _run_flags(kwargs: dict[str, object]) -> _RunFlags:
    """Take ``train``'s flags that are not the run's settings out of ``kwargs``; refuse those that
    do not go together."""
    flags = _RunFlags(
        resume_dir=pop_optional(kwargs, "resume", Path), quiet=pop_flag(kwargs, "quiet", bool),
        swanlab_mode=pop_flag(kwargs, "swanlab_mode", str), logger_project=pop_flag(kwargs, "logger_project", str),
        loggers=pop_flag(kwargs, "logger", tuple), chat_template=pop_optional(kwargs, "chat_template", str),
        preflight_only=pop_flag(kwargs, "preflight_only", bool), clamp=pop_flag(kwargs, "clamp_to_server_limits", bool),
        connect_timeout=pop_optional(kwargs, "connect_timeout", float),
        from_step=pop_optional(kwargs, "from_step", int), offline_fault=pop_optional(kwargs, "offline_fault", str),
        health_rules=_health_rules(pop_flag(kwargs, "health_rules", tuple)),
        estimate=pop_flag(kwargs, "estimate", bool), measure=pop_flag(kwargs, "estimate_measure", bool))
    if flags.measure and not flags.estimate:
        raise click.UsageError("--estimate-measure only applies with --estimate")
    if flags.estimate and flags.resuming:
        raise click.UsageError("--estimate projects a new run; it does not apply with --resume")
    if flags.from_step is not None and not flags.resuming:
        raise click.UsageError("--from-step needs --resume RUN_DIR (the run to restart)")
    return flags


# --- a resumed run ---------------------------------------------------------------------------


def _resumed_run(ctx: click.Context, flags: _RunFlags, kwargs: dict[str, object], explicit: set[str],
                 record: RunRecord | None, search: SearchOptions, checks: Prerequisites,
                 held: contextlib.ExitStack) -> _Start:
    """The run in ``--resume``'s directory, locked before anything in it is read for good, torn
    tails mended; its settings are config.json's with the changes a resume may make, and its
    data must be the file it started with."""
    from searchr1.commands.prerequisites import check_examples_file
    from searchr1.run.directory import RunDir
    from searchr1.basics.fileio import file_sha256

    resume_dir = flags.resume_dir
    assert resume_dir is not None
    if kwargs["run_dir"] is not None:
        raise click.UsageError("--resume and --run-dir contradict each other: --resume names the run directory")
    if record is not None:
        raise click.UsageError(f"--config {record.run_dir} starts a new run with that run's settings; "
                               "--resume continues a run with its own: use one of them")
    run = RunDir(resume_dir)
    stored: JsonObject = run.open()
    held.enter_context(run.locked())  # before anything is read for good or written
    run.check_writable()
    run.check_consistent(stored)
    for note in run.mend_torn_tails():
        click.secho(f"note: {note}", fg="yellow", err=True)
    changed = _changed_on_resume(ctx.params, kwargs, explicit, stored, flags)
    if ctx.params["max_steps"] is not None:
        stored["max_steps"] = ctx.params["max_steps"]
    costs_changed = _take_cost_changes(ctx.params, explicit, stored)
    guard = _guard_changes(ctx.params, explicit, stored, flags)
    segment = None
    if flags.from_step is not None or guard:
        segment = _resume_segment(ctx.params, kwargs, stored, changed, guard, flags.from_step)
    config = TrainConfig.from_json(stored)
    if checks.check(check_examples_file, Path(config.data), what="training data",
                    empty=f"no training examples in {config.data}") is not None \
            and file_sha256(config.data) != config.data_sha256:
        checks.add(f"{config.data} changed since the run started (sha256 differs); "
                   "the data order could not be reproduced")
    if config.probe and checks.check(file_sha256, config.probe) not in (None, config.probe_sha256):
        checks.add(f"probe file {config.probe} changed since the run started (sha256 differs); its metrics and the "
                   "curriculum's draws could not be reproduced")
    search = _resumed_search_options(search, config.search, explicit)
    return _Start(config, run, search, stored=stored, segment=segment, costs_changed=costs_changed)


def _changed_on_resume(params: Mapping[str, object], kwargs: dict[str, object], explicit: set[str],
                       stored: JsonObject, flags: _RunFlags) -> list[str]:
    """The recorded flags given now with another value than config.json's, sorted; refused
    unless each may change (an algorithm flag, with ``--from-step``)."""
    recorded = _flags(OnResume.FIXED) | _flags(OnResume.SEGMENT)  # what a resume compares with config.json
    changed = sorted(name for name in explicit & recorded
                     if _stored_value(stored, name) != _given(kwargs, params, name))
    fixed = [name for name in changed if flags.from_step is None or name not in _flags(OnResume.SEGMENT)]
    if fixed:
        assert flags.resume_dir is not None
        names = ", ".join("--" + name.replace("_", "-") for name in fixed)
        hint = ("only --max-steps may be raised; algorithm flags may change with --from-step K"
                if flags.from_step is None else "a restart with --from-step may change only " +
                ", ".join("--" + name.replace("_", "-") for name in sorted(_flags(OnResume.SEGMENT))))
        raise click.UsageError(f"{names} cannot change when resuming; the run's settings are in "
                               f"{flags.resume_dir / 'config.json'} ({hint})")
    return changed


def _take_cost_changes(params: Mapping[str, object], explicit: set[str], stored: JsonObject) -> bool:
    """Put another price table or budget given on this resume into ``stored``; whether one was."""
    changed = False
    for name in sorted(_flags(OnResume.COST)):
        if name in explicit and stored.get(name) != _plain(params[name]):
            stored[name] = _plain(params[name])
            changed = True
    return changed


def _guard_changes(params: Mapping[str, object], explicit: set[str], stored: JsonObject,
                   flags: _RunFlags) -> dict[str, JsonValue]:
    """The guard flags (collapse stop, health rules, offline fault) this resume sets to another
    value than config.json's: the health rules named now change, the others stay as recorded;
    ``--offline-fault none`` clears a recorded fault, which is otherwise kept (and said so)."""
    guard: dict[str, JsonValue] = {}
    if "stop_on_collapse" in explicit:
        guard["stop_on_collapse"] = _plain(params["stop_on_collapse"])
    if "health_rules" in explicit:  # the rules named now change; the others stay as recorded
        guard["health_rules"] = {**_json_object(stored.get("health_rules", {}), "health_rules"), **flags.health_rules}
    if flags.offline_fault is not None:  # "none" clears the recorded fault
        guard["offline_fault"] = None if flags.offline_fault == "none" else flags.offline_fault
    elif stored.get("offline_fault"):
        assert flags.resume_dir is not None
        click.echo(f"offline fault {stored['offline_fault']} kept from {flags.resume_dir / 'config.json'} "
                   "(--offline-fault none clears it)", err=True)
    return {name: value for name, value in guard.items()
            if stored.get(name, None if name == "offline_fault" else _MISSING) != value}


def _resume_segment(params: Mapping[str, object], kwargs: dict[str, object], stored: JsonObject, changed: list[str],
                    guard: dict[str, JsonValue], from_step: int | None) -> Segment:
    """The segment a resume starts (config.json field -> its value before and after), its
    changes applied to ``stored``."""
    fields = setting_params(TrainConfig)  # flag -> config.json field
    changes: dict[str, Change] = {
        fields.get(name, name): {"from": _stored_value(stored, name), "to": _given(kwargs, params, name)}
        for name in changed}
    changes.update({name: {"from": stored.get(name), "to": value} for name, value in guard.items()})
    stored.update({name: change["to"] for name, change in changes.items()})
    return {"from_step": from_step, "changed": changes}


# --- a new run -------------------------------------------------------------------------------


def _new_run(ctx: click.Context, flags: _RunFlags, kwargs: dict[str, object], explicit: set[str],
             record: RunRecord | None, search: SearchOptions, checks: Prerequisites) -> _Start:
    """A new run: its settings from the flags (and from the run ``--config`` reads where no flag
    is given), its data, a run directory (``runs/<run-name>`` unless named) and checkpoint names
    that no run beside it has recorded."""
    from searchr1.run.directory import RunDir
    from searchr1.basics.fileio import file_sha256
    from searchr1.training.checkpoints import new_run_id

    offline, policy = pop_flag(kwargs, "offline", bool), pop_flag(kwargs, "offline_policy", str)
    if not offline and "offline_policy" in explicit:
        raise click.UsageError("--offline-policy only applies with --offline")
    settings = _new_run_settings(kwargs, explicit, offline, policy, flags)
    given_data = settings.pop("data")
    assert given_data is None or isinstance(given_data, str)  # --data, as click gives it
    data = Path(given_data or (TRAIN if offline else "datasets/train.jsonl"))
    data_found = _check_training_data(data, given=bool(given_data), offline=offline, checks=checks)
    if not offline:
        from searchr1.wiring.services import check_base_model

        check_base_model(flag_value(settings, "base_model", str))
    rollout = _new_rollout(kwargs, settings, offline)
    run_dir = pop_optional(kwargs, "run_dir", Path)
    config = call_with(TrainConfig, {
        "data": str(data), "rollout": rollout, "offline": offline,
        "data_sha256": file_sha256(data) if data_found else "", "search": _search_record(search, offline),
        "run_id": new_run_id(), "code_version": __version__, **settings,
    })
    if record is not None:
        config = _from_record(ctx, record, config, run_dir)
    if config.probe and data_found:
        config = checks.check(probe_drops, config) or config
    run_dir = run_dir or _free_run_dir(Path("runs"), config.run_name,
                                       keep=record.run_dir if record is not None else None)
    run = RunDir(run_dir)
    _check_checkpoint_names(run, config, checks)
    return _Start(config, run, search)


def _new_run_settings(kwargs: dict[str, object], explicit: set[str], offline: bool, policy: str,
                      flags: _RunFlags) -> dict[str, object]:
    """The run's settings from the flags; offline, the twin's policy's own defaults for those not
    given, and the fault it injects. The scripted policy's logprobs are the script's, so its
    runs leave the sampler-learner mismatch rule off unless it is named."""
    settings = take_settings(TrainConfig, kwargs)
    settings["offline_policy"] = OfflinePolicy(policy) if offline else None
    if offline and flags.offline_fault not in (None, "none"):
        settings["offline_fault"] = flags.offline_fault
    if offline:  # the twin's policy has its own defaults (declared with each setting)
        fields = setting_params(TrainConfig)  # flag -> field name
        given = {fields.get(name, name) for name in explicit}
        settings.update({name: value for name, value in offline_defaults(TrainConfig, policy).items()
                         if name not in given})
    if settings["max_steps"] is None:
        raise click.UsageError("--max-steps is required for a live run (or pass --offline)")
    health_rules = flags.health_rules
    if offline and policy == OfflinePolicy.SCRIPTED and "mismatch_k3" not in health_rules:
        # the scripted sampler's logprobs are the script's, not the toy learner's: they never agree
        health_rules = {**health_rules, "mismatch_k3": None}
    settings["health_rules"] = health_rules
    return settings


def _check_training_data(data: Path, *, given: bool, offline: bool, checks: Prerequisites) -> bool:
    """Whether the training data's first line reads; what is wrong with it goes to ``checks``."""
    from searchr1.commands.prerequisites import check_examples_file

    # the package's own offline file missing is a broken install; the user's, not
    hint = ("" if given
            else f"; run `{invocation.command('prepare-data')}` first, or pass --data" if not offline
            else "; the package's offline data is missing: reinstall the package")
    return checks.check(check_examples_file, data, what="training data", missing_hint=hint,
                        empty=f"no training examples in {data}") is not None


def _new_rollout(kwargs: dict[str, object], settings: dict[str, object], offline: bool) -> RolloutConfig:
    """The rollout flags as a :class:`RolloutConfig`, and ``--loss-fn-config`` into ``settings``:
    refused where the offline twin could not compute the loss, or the sampler would be tempered
    without ``--allow-tempered-sampling``."""
    allow_tempered = pop_flag(kwargs, "allow_tempered_sampling", bool)
    rollout = rollout_config_from(kwargs, seed=flag_value(settings, "seed", int))
    policy = settings["offline_policy"]
    check_offline_group_size(policy if isinstance(policy, OfflinePolicy) else None, rollout.group_size)
    settings["loss_fn_config"] = loss_config = pop_flag(kwargs, "loss_fn_config", dict)
    if offline:  # the twin refuses what it cannot compute; say so before anything runs
        from searchr1.core.objective import LossConfigError, resolve_loss_config

        try:
            resolve_loss_config(flag_value(settings, "loss_fn", str), loss_config)
        except LossConfigError as error:
            raise click.UsageError(f"--loss-fn-config: {error}") from None
    if rollout.temperature != 1.0 or rollout.top_p != 1.0:
        if not allow_tempered:
            raise click.UsageError(
                f"--temperature {rollout.temperature} / --top-p {rollout.top_p}: the importance-sampling "
                "loss divides by the sampler's logprobs, which then belong to a tempered or truncated "
                "distribution, not the policy being trained; keep both at 1 or pass "
                "--allow-tempered-sampling to accept the bias")
        click.secho("warning: --allow-tempered-sampling: importance ratios are biased by temperature/top-p",
                    fg="yellow", err=True)
    return rollout


def _check_checkpoint_names(run: RunDir, config: TrainConfig, checks: Prerequisites) -> None:
    """Refuse (in ``checks``) checkpoint names that a run beside this one has recorded: saving
    under them would overwrite that run's checkpoints on PyTRIO."""
    from searchr1.run.directory import recorded_checkpoints
    from searchr1.training.checkpoints import checkpoint_prefix

    taken = sorted(name for name in recorded_checkpoints(run.path.parent)
                   if name.startswith(checkpoint_prefix(config)))
    if taken:
        checks.add(
            f"checkpoint names starting with {checkpoint_prefix(config)!r} are already recorded in "
            f"{recorded_checkpoints(run.path.parent)[taken[0]]}; saving under them would overwrite "
            "that run's checkpoints on PyTRIO")


# --- the checks and the run ------------------------------------------------------------------


def _one_measured_step(start: _Start, flags: _RunFlags, held: contextlib.ExitStack) -> tuple[_Start, _RunFlags]:
    """``--estimate --estimate-measure``: the run cut to one step, in a temporary directory,
    with no checkpoints, transcripts, budget, loggers or progress bars."""
    click.echo("estimate: measuring one step in a temporary directory", err=True)
    from searchr1.run.directory import RunDir

    run = RunDir(Path(held.enter_context(tempfile.TemporaryDirectory())) / "measure")
    config = dataclasses.replace(start.config, max_steps=1, save_every=0, transcripts_per_step=0, budget=None,
                                 budget_tokens=None)
    return (dataclasses.replace(start, config=config, run=run),
            dataclasses.replace(flags, loggers=("none",), quiet=True))


def _check_setup(start: _Start, flags: _RunFlags, checks: Prerequisites, held: contextlib.ExitStack) -> Loggers | None:
    """Into ``checks``: the search setup and keys, the tools, the judge, the loggers, the run directory (a
    new one locked: a second process on it is refused) and the PyTRIO key. A configured
    estimate samples nothing: it needs no search, service or run directory. Returns the
    loggers, not started yet."""
    from searchr1.commands.prerequisites import check_pytrio
    from searchr1.wiring.services import check_search_setup, check_tool_setup

    if flags.estimate and not flags.measure:
        return None
    config, run = start.config, start.run
    checks.check(check_search_setup, start.search, offline=config.offline)
    checks.check(check_tool_setup, config.rollout.tools, start.search)
    if config.judge is not None:
        from searchr1.commands.eval import check_judge

        checks.check(check_judge, config.judge, offline=config.offline, env_file=start.search.env_file,
                     cassette=Path(config.judge_cassette) if config.judge_cassette else None)
    loggers = None
    if not flags.preflight_only:
        loggers = checks.check(_planned_loggers, flags.loggers, flags.swanlab_mode, flags.logger_project, config,
                               run.path)
    if not flags.resuming:
        if not flags.preflight_only:  # a second process on this --run-dir is refused here
            checks.check(held.enter_context, run.locked())
        checks.check(run.check_creatable)
    if not config.offline:
        check_pytrio(checks)
    return loggers


def probe_drops(config: TrainConfig) -> TrainConfig:
    """``config`` with the questions its probe's filters drop (``dropped_questions``) and the probe's
    sha256; one line naming the probe when it cannot be read, is another dataset's, or would leave
    no question to train on. Said on standard error: what was dropped and why."""
    from searchr1.basics.fileio import file_sha256
    from searchr1.basics.wording import plural
    from searchr1.data.dataset import load_examples
    from searchr1.evaluation.probe import read_probe
    from searchr1.training.filters import ProbeMismatch, filter_examples

    assert config.probe is not None
    probe = read_probe(config.probe)
    try:
        filtered = filter_examples(load_examples(config.data), probe, drop_guessable=config.drop_guessable,
                                   drop_solved=config.drop_solved)
    except ProbeMismatch as error:
        raise click.BadParameter(f"{config.probe}: {error}", param_hint="--probe") from None
    if not filtered.kept:
        raise click.BadParameter(f"{config.probe}: the filters leave no training question", param_hint="--probe")
    said = [f"{plural(len(ids), 'question')} {reason}" for reason, ids in filtered.dropped.items()]
    if said or filtered.unprobed:
        click.echo(f"--probe {config.probe}: dropped {', '.join(said) or 'nothing'}"
                   + (f"; {plural(filtered.unprobed, 'question')} not in the probe, kept" if filtered.unprobed else "")
                   + " (recorded in config.json's dropped_questions)", err=True)
    return dataclasses.replace(config, probe_sha256=file_sha256(config.probe), dropped_questions=filtered.dropped)


def _training_examples(config: TrainConfig) -> list[SearchExample]:
    """The run's examples in its seed's order (every line of the file read), cut to
    ``--max-train-samples``; a warning when a step must repeat questions."""
    from searchr1.data.dataset import shuffled_examples
    from searchr1.training.filters import apply_recorded_drops

    examples = apply_recorded_drops(shuffled_examples(config.data, config.seed), config.dropped_questions)
    if config.max_train_samples:
        examples = examples[: config.max_train_samples]
    if not examples:
        raise click.ClickException(f"no training examples in {config.data}")
    if config.questions_per_batch > len(examples):
        click.secho(f"warning: --questions-per-batch {config.questions_per_batch} is more than the "
                    f"{len(examples)} training examples, so every step repeats questions", fg="yellow", err=True)
    return examples


def _start_service(start: _Start, flags: _RunFlags, tokenizer: Qwen35Tokenizer,
                   held: contextlib.ExitStack) -> pytrio.ServiceClient:
    """The PyTRIO service: live, or the offline twin with its home in the run directory."""
    from searchr1.run.directory import TWIN_HOME
    from searchr1.wiring.services import start_service

    config = start.config
    if not config.offline:
        return start_service(tokenizer, offline=False, home=None, connect_timeout=flags.connect_timeout,
                             sampling_concurrency=config.rollout.sampling_concurrency)
    # --preflight-only writes nothing, not even the twin's home, for a new run (a temporary one,
    # removed when the command ends)
    home = (Path(held.enter_context(tempfile.TemporaryDirectory(prefix="searchr1-preflight-")))
            if flags.preflight_only and not flags.resuming else start.run.path / TWIN_HOME)
    from searchr1.twin import TwinFaults
    from searchr1.twin.config import parse_offline_fault

    return start_service(tokenizer, offline=True, home=home, policy=config.offline_policy,
                         sampling_concurrency=config.rollout.sampling_concurrency,
                         max_staleness=twin_staleness(config),
                         faults=TwinFaults(**parse_offline_fault(config.offline_fault or "none")))


def _run_session(start: _Start, flags: _RunFlags, service: pytrio.ServiceClient, tokenizer: Qwen35Tokenizer,
                 examples: list[SearchExample],
                 loggers: Loggers | None, account: RunAccount) -> tuple[int, _StopOnInterrupt]:
    """Run the steps (or, with ``--preflight-only``, connect and stop); a run that stops early
    exits with its code: 1 stopped, 3 collapsed, 4 over budget, 130 interrupted at once.
    Returns the steps completed and the Ctrl-C handler (whether a stop was requested)."""
    from searchr1.run.costs import BudgetReached
    from searchr1.wiring.services import open_search, tool_backends
    from searchr1.training.loop import CollapseDetected, TrainingRun, TrainingStopped
    from searchr1.basics.wording import plural

    config, run, search = start.config, start.run, start.search
    resume = _resume_point(run, flags)
    reporter = None
    if not flags.preflight_only:
        from searchr1.run.progress import make_reporter

        reporter = make_reporter(quiet=flags.quiet)
    stop = _StopOnInterrupt()

    async def main() -> int:
        judge = None if flags.preflight_only else _training_judge(config, service, tokenizer, search)
        try:
            async with open_search(search, offline=config.offline) as backend:
                trainer = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=backend,
                                      tools=tool_backends(config.rollout.tools, backend),
                                      examples=examples, reporter=reporter, logger=loggers, account=account,
                                      judge=judge)
                first = trainer.connect(resume)
                if flags.preflight_only:
                    click.echo(f"preflight passed: the service's tokenizer matches; the run would start at step "
                               f"{first} of {config.max_steps}", err=True)
                    return first
                _write_run_config(start, first, flags)
                stop.trainer = trainer
                if loggers is not None:
                    _start_loggers(loggers, config)  # they write into the run directory, which exists now
                return await trainer.run_steps(resume)
        finally:
            if judge is not None and hasattr(judge.backend, "aclose"):
                await judge.backend.aclose()  # a recording judge writes its cassette here

    click.echo(f"{'preflight only, nothing is written; ' if flags.preflight_only else ''}run directory: {run.path}  "
               f"({'offline twin' if config.offline else 'live PyTRIO'}, backend {search.backend}, "
               f"{plural(config.max_steps, 'step')})",
               err=True)
    try:
        with stop:
            return asyncio.run(main()), stop
    except TrainingStopped as stopped:
        click.secho(str(stopped), fg="red", err=True)
        sys.exit(1)
    except CollapseDetected as collapse:
        click.secho(str(collapse), fg="red", err=True)
        sys.exit(COLLAPSE_EXIT_CODE)
    except BudgetReached as reached:
        click.secho(str(reached), fg="yellow", err=True)
        sys.exit(BUDGET_EXIT_CODE)
    except KeyboardInterrupt:
        click.secho(_interrupted_at_once(run, stop, resuming=flags.resuming), fg="yellow", err=True)
        sys.exit(130)
    finally:
        if loggers is not None:
            loggers.finish()


def _training_judge(config: TrainConfig, service: pytrio.ServiceClient, tokenizer: Qwen35Tokenizer,
                    search: SearchOptions) -> Judge | None:
    """The judge of ``--judge MODEL --judge-weight W`` (eval's, with its cache), or None."""
    if config.judge is None or not config.judge_weight:
        return None
    from searchr1.commands.eval import make_judge

    return make_judge(config.judge, service=service, tokenizer=tokenizer, base_model=config.base_model,
                      offline=config.offline, cache=config.judge_cache, env_file=search.env_file,
                      cassette=Path(config.judge_cassette) if config.judge_cassette else None)


def _resume_point(run: RunDir, flags: _RunFlags) -> ResumePoint | None:
    """Where a resume starts: the last checkpoint, or that of ``--from-step K`` (refused when
    there is none); None for a new run."""
    resume = run.resume_point(flags.from_step) if flags.resuming else None
    if flags.from_step is not None and resume is None:
        steps = run.checkpoint_steps()
        raise click.ClickException(f"--from-step {flags.from_step}: {run.path} has no checkpoint of step "
                                   f"{flags.from_step}; checkpoints: {', '.join(map(str, steps)) or 'none'}")
    return resume


def _write_run_config(start: _Start, first: int, flags: _RunFlags) -> None:
    """config.json as this session starts at step ``first``: a new run's; a resume's with another
    price table or budget; or a resume's new segment (a restart from step K moves later
    checkpoints and transcripts aside), saying what changed."""
    from searchr1.basics.wording import plural

    config, run, stored, segment = start.config, start.run, start.stored, start.segment
    if not flags.resuming:
        run.create(config.to_json())
    if start.costs_changed and segment is None:
        run.write_config({**config.to_json(), **{k: stored[k] for k in ("segments",) if k in stored}})
    if segment is None:
        return
    segments = [*as_list(stored.get("segments", []), "segments"), {**segment, "from_step": first, "time": time.time()}]
    recorded = {**config.to_json(), "segments": segments}
    if flags.from_step is None:
        run.write_config(recorded)
    else:
        moved = run.restart_at(first, recorded)
        click.echo(f"restarting {run.path} at step {first}: "
                   f"{plural(moved['checkpoints.jsonl'], 'later checkpoint')} and "
                   f"{plural(moved['transcripts.jsonl'], 'transcript line')} moved to *.rewound.jsonl",
                   err=True)
    if segment["changed"]:
        click.echo(f"changed from step {first}: " + ", ".join(
            f"{name} {change['from']} -> {change['to']}" for name, change in segment["changed"].items()),
            err=True)


def _report_finished(start: _Start, completed: int, stop: _StopOnInterrupt) -> None:
    """What a finished run says: where its metrics are, its first and last rewards, its last
    checkpoint and how to evaluate it; a run stopped by Ctrl-C says how to continue (exit 130)."""
    from searchr1.basics.wording import plural

    config, run = start.config, start.run
    last = run.resume_point()
    if stop.requested and completed < config.max_steps:
        click.secho(f"stopped on Ctrl-C after step {completed - 1}; checkpoint {last.name if last else '-'} saved "
                    f"(step {completed} starts from it). "
                    f"Continue with: {invocation.command(f'train --resume {run.path}')}",
                    fg="yellow", err=True)
        sys.exit(130)
    click.echo(f"done: {plural(completed, 'step')}. metrics: {run.file('metrics.jsonl')}")
    rewards = [as_float(line["reward/mean"], "reward/mean") for line in run.metrics() if "reward/mean" in line]
    if len(rewards) >= 2:
        n = min(5, len(rewards) // 2)
        click.echo(f"mean reward: first {plural(n, 'step')} {sum(rewards[:n]) / n:+.3f}, "
                   f"last {plural(n, 'step')} {sum(rewards[-n:]) / n:+.3f}")
    if last is not None:
        click.echo(f"last checkpoint: {last.name}  weights: {last.weights_path}")
        click.echo(f"evaluate it with: {invocation.command(f'eval --checkpoint {run.path}')}"
                   + (f" --backend {start.search.backend}" if not config.offline else ""))


def _run_account(config: TrainConfig) -> RunAccount:
    """The run's price table and budgets (a bad price table is one line naming file, line and key)."""
    from searchr1.run.costs import Budget, RunAccount, load_prices

    if config.budget is not None and not config.prices:
        raise click.UsageError("--budget needs --prices FILE: the budget is an amount in the price table's currency "
                               "(--budget-tokens counts tokens without prices)")
    prices = load_prices(config.prices) if config.prices else None
    return RunAccount(prices, Budget(config.budget, config.budget_tokens))


def twin_staleness(config: TrainConfig) -> int:
    """Weight-changing optimiser steps a sampler of this run may lag behind the training run:
    every step makes ``num_substeps`` of them and a batch samples on weights up to K steps old,
    so the last mini-batch of a step trains ``(K + 1) * N - 1`` updates after its sampler (with
    --partial-rollouts a trajectory's oldest turn is up to S = --max-version-lag steps old)."""
    lag = config.max_version_lag if config.partial_rollouts else config.max_steps_off_policy
    return (lag + 1) * config.num_substeps - 1


def _fit_server_limits(service: pytrio.ServiceClient, config: TrainConfig, *, clamp: bool,
                       resuming: bool) -> TrainConfig:
    """Check the trajectory budget against the service's limits for the model (or lower it
    with --clamp-to-server-limits on a fresh run); the limits are recorded in config.json."""
    import dataclasses

    from searchr1.runtime.preflight import fit_trajectory_budget, read_server_limits

    limits = read_server_limits(service, config.base_model)
    window = config.rollout.context_window is not None  # --context fold: one context holds the window
    fit = fit_trajectory_budget(limits, config.rollout.window, clamp=clamp and not resuming,
                                group_size=config.rollout.group_size,
                                flag="--context-window" if window else "--max-trajectory-tokens")
    for warning in fit.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    rollout = (dataclasses.replace(config.rollout, context_window=fit.max_trajectory_tokens) if window
               else dataclasses.replace(config.rollout, max_trajectory_tokens=fit.max_trajectory_tokens))
    if resuming:
        return config
    return dataclasses.replace(config, rollout=rollout, server_limits=limits.to_json())


class _StopOnInterrupt:
    """First Ctrl-C: let the current step finish, checkpoint, stop (``trainer.request_stop``).
    Second Ctrl-C: stop at once (``KeyboardInterrupt``; finished steps are on disk, the resume
    point is the last checkpoint)."""

    def __init__(self) -> None:
        self.trainer: TrainingRun | None = None
        self.requested = False
        self._previous: signal._HANDLER = None

    def __enter__(self) -> _StopOnInterrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or self.trainer is None:
            raise KeyboardInterrupt
        self.requested = True
        self.trainer.request_stop()
        click.secho("\nCtrl-C: finishing the current step, then saving a checkpoint "
                    "(press Ctrl-C again to quit at once)", fg="yellow", err=True)


def _interrupted_at_once(run: RunDir, stop: _StopOnInterrupt, *, resuming: bool) -> str:
    """What a second Ctrl-C (or one during start-up) leaves, and what can be done with it."""
    if stop.trainer is None or not run.file("config.json").is_file():
        return _interrupted_in_start_up(run, resuming=resuming)
    from searchr1.basics.wording import plural

    last = run.resume_point()
    if last is None:
        return (f"interrupted at once, before the first checkpoint: {plural(run.finished_steps(), 'finished step')} in "
                f"{run.path}, but no checkpoint to resume from; "
                f"`{invocation.command(f'train --resume {run.path}')}` "
                "starts it over from step 0 (their metrics are kept in metrics.rewound.jsonl)")
    return (f"interrupted at once. Finished steps are in {run.path}; resume from checkpoint {last.name} "
            f"(step {last.step}) with: {invocation.command(f'train --resume {run.path}')}")


def _interrupted_in_start_up(run: RunDir, *, resuming: bool) -> str:
    """What a Ctrl-C before the first step leaves: nothing trained, nothing lost."""
    if resuming:
        return (f"train interrupted (Ctrl-C) during start-up, before its next step; {run.path} is as it was, "
                f"nothing in it lost (continue with: {invocation.command(f'train --resume {run.path}')})")
    return ("train interrupted (Ctrl-C) during start-up, before the first step: nothing was trained, so "
            "nothing is lost or to resume; run the same command again to start")


def _flags(role: OnResume) -> set[str]:
    """The names of ``train``'s flags whose declaration gives them ``role`` on a resume."""
    return {param.name for param in train.params if param.name and getattr(param, "on_resume", None) is role}


def _from_record(ctx: click.Context, record: RunRecord, config: TrainConfig, run_dir: Path | None) -> TrainConfig:
    """A new run's settings with those of the run whose record ``--config`` read that no flag
    carries; refused when it would write over that run, or could not search as it did."""
    command_line = command_line_params(ctx)
    if run_dir is not None and same_directory(run_dir, record.run_dir):
        raise click.UsageError(f"--run-dir {run_dir} is the run --config reads; a new run needs its own directory "
                               f"(continue that one with: {invocation.command(f'train --resume {run_dir}')})")
    if record.credentials_removed and "retriever_url" not in command_line:
        raise click.UsageError(f"the --retriever-url of {record.path} carried credentials, which config.json does "
                               "not keep; pass the same --retriever-url again")
    config = with_unflagged(config, record, command_line)
    for warning in record_warnings(record, config, __version__):
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    return config


def _free_run_dir(root: Path, name: str, *, keep: Path | None = None) -> Path:
    """``runs/<name>``, or ``runs/<name>-2``, ``-3``… when taken (a directory whose run never
    finished a step is not taken, unless it is ``keep``, the run ``--config`` reads): a default
    never collides."""
    from searchr1.run.directory import RunDir

    candidate, number = root / name, 1
    while not RunDir(candidate).can_start_over() or (keep is not None and same_directory(candidate, keep)):
        number += 1
        candidate = root / f"{name}-{number}"
    return candidate


def _health_rules(given: tuple[str, ...]) -> dict[str, float | None]:
    """``--health-rule NAME=VALUE`` flags as the thresholds they set (None: the rule is off)."""
    from searchr1.health.rules import parse_rule_override

    rules: dict[str, float | None] = {}
    for text in given:
        try:
            name, value = parse_rule_override(text)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        rules[name] = value
    return rules


def _given(kwargs: dict[str, object], params: Mapping[str, object], name: str) -> JsonValue:
    """A flag's value as config.json would record it (``--loss-fn-config`` already parsed, the
    system prompt file's text)."""
    from searchr1.commands.options import read_system_prompt

    if name == "system_prompt_file":
        path = params[name]
        assert path is None or isinstance(path, Path)  # --system-prompt-file, as click gives it
        return read_system_prompt(path)
    return _plain(kwargs[name]) if name == "loss_fn_config" else _plain(_as_recorded(name, params[name]))


def _plain(value: object) -> JsonValue:
    """A value as config.json holds it: a path as text, a tuple of names as a list (click gives
    every flag as one of these, or as a JSON value already)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    raise TypeError(f"a flag's value of type {type(value).__name__} has no JSON form")


def _json_object(value: JsonValue, name: str) -> JsonObject:
    """A JSON object of config.json, kept a JSON object (its values are written back as read)."""
    if not isinstance(value, dict):
        raise TypeError(f"{name}: expected an object, got {type(value).__name__}")
    return value


def _stored_value(stored: JsonObject, name: str) -> JsonValue | _Missing:
    """A flag's value as the run's config.json recorded it (``_MISSING`` if it was not), found
    through the declarations: a TrainConfig setting at the top, a RolloutConfig one under
    ``rollout`` (the system prompt file as its text), a search one under ``search.options``."""
    if name == "system_prompt_file":
        return _json_object(stored.get("rollout", {}), "rollout").get("system_prompt", _MISSING)
    search = _json_object(stored.get("search", {}), "search")
    scopes = ((setting_params(TrainConfig), stored),
              (setting_params(RolloutConfig), _json_object(stored.get("rollout", {}), "rollout")),
              (setting_params(SearchOptions), _json_object(search.get("options", {}), "search.options")))
    for params, scope in scopes:
        if name in params:
            return scope.get(params[name], _MISSING)
    return stored.get(name, _MISSING)


def _as_recorded(name: str, value: T) -> T | str:
    """A flag's value as config.json records it (a private value is kept only in part)."""
    from searchr1.basics.secrets import redact_url
    from searchr1.search.wikipedia import CONTACT_PLACEHOLDER

    if name == "retriever_url" and value:
        return redact_url(str(value))  # a URL's text
    if name == "wikipedia_contact" and value:
        return CONTACT_PLACEHOLDER
    return value


def _search_options_record(search: SearchOptions) -> JsonObject:
    """The search flags to reuse on --resume (paths as strings, nothing secret: the retriever
    URL without its userinfo and credential parameters, the Wikipedia contact as a placeholder)."""
    record: JsonObject = {}
    for key, value in search.__dict__.items():
        record[key] = str(value) if isinstance(value, Path) else value
    for name in ("retriever_url", "wikipedia_contact"):
        record[name] = _as_recorded(name, record.get(name))
    return record


def _search_record(search: SearchOptions, offline: bool) -> JsonObject:
    """``config.json``'s ``search``: what was used, and whether a credential was left out."""
    from searchr1.basics.secrets import redact_url
    from searchr1.wiring.services import describe_search

    record: JsonObject = {**describe_search(search, offline=offline), "options": _search_options_record(search)}
    if search.retriever_url and redact_url(search.retriever_url) != search.retriever_url:
        record["retriever_url_credentials_removed"] = True
    return record


def _resumed_search_options(given: SearchOptions, recorded: JsonObject, explicit: set[str]) -> SearchOptions:
    """The run's search flags from config.json; the retriever URL and the Wikipedia contact
    given again now are used as given (config.json keeps neither in full)."""
    from searchr1.search.wikipedia import CONTACT_PLACEHOLDER

    options: dict[str, object] = dict(_json_object(recorded.get("options", {}), "search.options"))
    for name in ("retriever_url", "wikipedia_contact"):
        if name in explicit:
            options[name] = getattr(given, name)
    if options.get("wikipedia_contact") == CONTACT_PLACEHOLDER:
        options["wikipedia_contact"] = None  # $SEARCHR1_CONTACT, as on any run without the flag
    if recorded.get("retriever_url_credentials_removed") and "retriever_url" not in explicit:
        raise click.UsageError(
            "the run's --retriever-url carried credentials, which config.json does not keep; "
            "pass the same --retriever-url again with --resume")
    return call_with(SearchOptions, {**given.__dict__, **options})


def _planned_loggers(requested: tuple[str, ...], swanlab_mode: str, project: str, config: TrainConfig,
                     run_path: Path) -> Loggers:
    """The --logger writers, checked now (a missing package is one line before any work) and
    started once the run directory exists."""
    from searchr1.run.loggers import Loggers, LoggerSettings, LoggerSetupError, resolve_loggers

    try:
        names = resolve_loggers(requested, offline=config.offline, swanlab_mode=swanlab_mode)
        return Loggers(names, LoggerSettings(run_name=config.run_name, run_dir=run_path, config=config.to_json(),
                                             project=project, swanlab_mode=swanlab_mode))
    except LoggerSetupError as error:
        raise click.UsageError(str(error)) from None


def _start_loggers(loggers: Loggers, config: TrainConfig) -> None:
    import dataclasses

    from searchr1.run.loggers import LoggerSetupError

    loggers.settings = dataclasses.replace(loggers.settings, config=config.to_json())  # as finally fitted
    try:
        loggers.start()
    except LoggerSetupError as error:
        raise click.ClickException(str(error)) from None

"""``eval``: evaluate a base model or a checkpoint on the dev set (live PyTRIO, or
offline: the scripted sampler and the search cassettes). The runner is
:mod:`searchr1.evaluation.evaluate`; this module turns flags into its inputs and prints the result."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import click

from searchr1.commands.search_options import search_options
from searchr1.search.options import SearchOptions
from searchr1.commands.options import (
    check_offline_group_size,
    connect_timeout_option,
    on_interrupt,
    rollout_config_from,
    rollout_options,
    run_guarded,
)
from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.settings_options import config_file_option, pop_flag, pop_optional
from searchr1.offline import OFFLINE_POLICIES, OfflinePolicy
from searchr1.basics import invocation
from searchr1.basics.json_types import as_float, as_object, as_str

if TYPE_CHECKING:
    import httpx
    import pytrio

    from searchr1.commands.prerequisites import Prerequisites
    from searchr1.core.rollout import RolloutConfig
    from searchr1.core.types import SearchExample
    from searchr1.runtime.tokenizer import Qwen35Tokenizer
    from searchr1.evaluation.evaluate import EvalOutcome
    from searchr1.evaluation.judge import Judge
    from searchr1.run.costs import PriceTable
    from searchr1.run.progress import CountingBar

LIVE_DATA = Path("datasets/dev.jsonl")
PROTOCOL_DATA = Path("datasets/test.jsonl")
# What `--protocol search-r1` fixes: the paper's retrieval (top-3 wiki-18 passages), greedy
# decoding with one sample, its action budget B = 4, 500-token responses and observations.
SEARCH_R1_SETTINGS: dict[str, float] = {"temperature": 0.0, "top_p": 1.0, "group_size": 1, "max_search_calls": 4,
                                      "max_assistant_turns": 5, "max_assistant_tokens": 500,
                                      "max_tool_response_tokens": 500}
SEARCH_R1_TOPK = 3
SEARCH_R1_BACKENDS = ("local", "retriever")
RESULT_DIR = Path("eval_result")


@click.command("eval", cls=SectionedCommand, context_settings={"show_default": True})
@config_file_option(records="the output's eval_config line records the merged result")
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="No key, no network: the offline PyTRIO twin (the real client against a server on "
                   "127.0.0.1) and the backend's offline search cassette.")
@click.option("--data", cls=SectionOption, section="run", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Eval JSONL [default: datasets/dev.jsonl; the shipped offline dev set with --offline].")
@click.option("--limit", cls=SectionOption, section="run", type=click.IntRange(min=1), default=None,
              help="Evaluate N questions spread evenly across sources (round-robin), not the first N lines "
                   "[default: all].")
@click.option("--base-model", cls=SectionOption, section="run", default="Qwen/Qwen3.5-4B")
@click.option("--model-path", cls=SectionOption, section="run", default=None, metavar="URI",
              help="Sampler-weights URI of a checkpoint (trio://…, printed by train) [default: the base model].")
@click.option("--output", "-o", cls=SectionOption, section="run",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Eval JSONL to write or resume [default: eval_result/eval_[offline_]<checkpoint or "
                   "model name, offline twin-<policy>>_<backend>.jsonl].")
@click.option("--overwrite", cls=SectionOption, section="run", is_flag=True,
              help="Start the output afresh; without it an existing output is resumed (and refused if it "
                   "was produced with another configuration).")
@click.option("--checkpoint", "checkpoint_run", cls=SectionOption, section="run",
              type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="RUN_DIR",
              help="Evaluate the last checkpoint of this training run (offline or live; its weights and, "
                   "offline, the twin it trained on), instead of copying a URI into --model-path.")
@click.option("--offline-policy", cls=SectionOption, section="service",
              type=click.Choice(OFFLINE_POLICIES), default=OfflinePolicy.LEARNING.value,
              help="With --offline: the policy the twin serves (learning: a small model that `train --offline` "
                   "improves; scripted: the fixed scenario of the golden tests).")
@click.option("--offline-home", cls=SectionOption, section="service",
              type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Checkpoint store of the fake PyTRIO service, to evaluate a `train --offline` checkpoint "
                   "(runs/<run-name>/twin; or use --checkpoint RUN_DIR) [default: an empty temporary one].")
@click.option("--protocol", cls=SectionOption, section="run", type=click.Choice(["search-r1"]), default=None,
              help="Fix the Search-R1 paper's evaluation settings (top-3 passages, greedy, one sample, a "
                   "budget of 4 searches, 500-token turns and observations; --backend local or retriever, "
                   "default data datasets/test.jsonl) and print its published EM beside ours.")
@rollout_options(group_size=1, temperature=0.0)
@click.option("--seed", cls=SectionOption, section="run", type=int, default=42,
              help="Sampling seeds (with each question's position in the data).")
@click.option("--chat-template", cls=SectionOption, section="service", type=click.Path(dir_okay=False), default=None,
              help="Another copy of the Qwen3.5 chat template (checked by sha256).")
@click.option("--quiet", cls=SectionOption, section="logging", is_flag=True, help="No progress bar.")
@click.option("--judge", "judge_model", cls=SectionOption, section="judge", default=None, metavar="MODEL",
              help="Also ask a judge whether each answer means the same as a gold answer (judge/... metrics): "
                   "'twin' offline (the twin's documented rule), a deepseek-* model (the DeepSeek chat API, "
                   "DEEPSEEK_API_KEY), or a PyTRIO model name. Here it only reports; in training it becomes a "
                   "reward term with train --judge MODEL --judge-weight W.")
@click.option("--judge-cache", cls=SectionOption, section="judge", default=None, metavar="PATH|off",
              help="Judgements by (question, gold, prediction, judge, prompt version) [default: "
                   "runs/judge-cache.jsonl].")
@click.option("--judge-cassette", cls=SectionOption, section="judge",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With a deepseek-* judge: replay its answers from this cassette (offline), or record them "
                   "into it (live; the key is never written).")
@click.option("--prices", cls=SectionOption, section="cost",
              type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="TOML price table (docs/prices.example.toml): the summary's cost/... next to its usage/... counts.")
@connect_timeout_option()
@search_options(default_backend="deepseek")
def eval_command(search: SearchOptions, config: Path | None, **kwargs: object) -> None:
    """Evaluate a model on the dev set: exact match per source, macro and micro EM with
    95% intervals (Wilson, never a point), format rate, rollout and search metrics.

    \b
    Offline:     %(prog)s eval --offline --output eval_result/offline.jsonl
    Base model:  %(prog)s eval --backend zhihu
    Checkpoint:  %(prog)s eval --backend zhihu --checkpoint runs/<run-name>
                 %(prog)s eval --backend zhihu --model-path trio://…/<run-name>-<id>-step-000020-weights
    Plot:        %(prog)s plot eval eval_result/*.jsonl -o eval_result/em.png

    The output holds one record per question (the whole transcript: turn texts, queries,
    observations, termination reason, reward, EM, format) and a closing summary with the exact
    configuration. Records are written as questions finish; an interrupted run keeps them and
    writes a summary marked partial, and rerunning the same command resumes it (questions
    already recorded are skipped, the summary is rewritten).
    """
    with contextlib.ExitStack() as held:  # the output's lock, for the life of the command
        run_guarded(lambda: _eval(search, kwargs, held))


class CodeVersion(TypedDict):
    """An eval output's ``code_version``."""

    searchr1: str
    git_commit: str | None
    git_dirty: bool | None


def code_version() -> CodeVersion:
    """The package version and, in a git checkout, the commit and whether tracked files differ."""
    from searchr1 import __version__

    version: CodeVersion = {"searchr1": __version__, "git_commit": None, "git_dirty": None}
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return version
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return version
    version["git_commit"], version["git_dirty"] = commit or None, bool(status.strip())
    return version


def default_output(base_model: str, model_path: str | None, backend: str, offline: bool,
                   offline_policy: str | None = None) -> Path:
    """``eval_result/eval_[offline_]<what>_<backend>.jsonl``: the checkpoint's name, else the base
    model, or offline the twin's policy (``twin-learning``)."""
    if model_path:
        label = model_path.rstrip("/").rsplit("/", 1)[-1]
    else:
        label = f"twin-{offline_policy or 'scripted'}" if offline else base_model.rsplit("/", 1)[-1]
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "model"
    return RESULT_DIR / f"eval_{'offline_' if offline else ''}{label}_{backend}.jsonl"


def _manifest_sha256(data: Path) -> str | None:
    from searchr1.data.dataset import MANIFEST_NAME
    from searchr1.basics.fileio import file_sha256

    manifest = data.parent / MANIFEST_NAME
    return file_sha256(manifest) if manifest.is_file() else None


def _repo_relative(path: str | None) -> str | None:
    """A path inside the repository relative to its root (the shipped cassettes), else as given."""
    from searchr1.offline import REPO_ROOT

    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path


def build_run_config(*, offline: bool, base_model: str, model_path: str | None, search: SearchOptions,
                     rollout: RolloutConfig, data: Path, limit: int | None, chat_template: str | None,
                     offline_home: Path | None, offline_policy: str = OfflinePolicy.LEARNING) -> dict[str, object]:
    """The exact configuration stored in the header and summary (plain JSON, nothing secret).
    The flat ``search_*`` and ``dataset_sha256`` names are the ones ``plot eval`` compares."""
    from searchr1.basics.fileio import file_sha256
    from searchr1.offline import SCENARIO
    from searchr1.core.budgets import tool_schemas
    from searchr1.core.rollout import effective_system_prompt
    from searchr1.wiring.services import describe_search

    described = describe_search(search, offline=offline)
    cassette = described["cassette"]  # its path's text, or null
    tool = as_object(tool_schemas(rollout)[0]["function"], "function")
    return {
        "sampling_backend": f"offline-{offline_policy}" if offline else "pytrio",
        "offline": offline,
        "base_model": base_model,
        "model_path": model_path,
        "search_backend": described["backend"],
        "search_concurrency": described["concurrency"],
        "search_timeout": described["timeout"],
        "search_model": described["model"],
        "search_cassette": _repo_relative(cassette if isinstance(cassette, str) else None),
        "search_cache": described["cache"],
        **({"search_index": described["index"], "search_topk": described["topk"]}
           if described["backend"] == "local" else {}),
        "sampling": {"temperature": rollout.temperature, "top_p": rollout.top_p, "seed": rollout.seed,
                     "max_tokens": rollout.max_assistant_tokens},
        "rollout": asdict(rollout),
        "system_prompt": effective_system_prompt(rollout),
        "tool_description": as_str(tool["description"], "description"),
        "dataset": str(data),
        "dataset_sha256": file_sha256(data),
        "manifest_sha256": _manifest_sha256(data),
        "scenario_sha256": file_sha256(SCENARIO) if offline else None,
        "limit": limit,
        "chat_template": chat_template,
        "offline_home": str(offline_home) if offline_home else None,
        "code_version": code_version(),
    }


class _Bar:
    """:class:`~searchr1.run.progress.CountingBar` over questions, opened once the total is known."""

    def __init__(self) -> None:
        self.bar: CountingBar | None = None

    def start(self, total: int, done: int) -> None:
        from searchr1.run.progress import CountingBar

        bar = self.bar = CountingBar("questions", total).__enter__()
        if done:
            bar.advance(done)

    def advance(self, count: int = 1) -> None:
        if self.bar is not None:
            self.bar.advance(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@dataclass(frozen=True)
class RunCheckpoint:
    """What ``eval --checkpoint RUN_DIR`` needs from a training run."""

    weights_path: str
    base_model: str
    offline: bool
    offline_home: Path | None
    offline_policy: str | None
    algorithm: dict[str, object] | None = None  # how the run trained (searchr1.run.algorithm.algorithm_of)
    rendering: RunRendering = field(default_factory=lambda: RunRendering())  # how its contexts were made


@dataclass(frozen=True)
class RunRendering:
    """How a training run made its contexts, which its checkpoint is sampled with too: thinking
    on or off, and with ``--context fold`` the window and the whole trajectory's budget."""

    thinking: bool = False
    window: int | None = None  # --context fold's --context-window (None: full)
    whole: int | None = None  # --max-trajectory-tokens, with fold


def rollout_as_trained(rollout: RolloutConfig, rendering: RunRendering, *, quiet: bool = False) -> RolloutConfig:
    """``rollout`` with what its checkpoint's run trained with and the flags did not ask for:
    thinking on, and ``--context fold`` with its window (a model trained to reason is sampled
    reasoning, one trained on folded contexts is sampled folding). Said on standard error unless
    ``quiet``."""
    from searchr1.core.context import ContextPolicy

    said: list[str] = []
    if rendering.thinking and not rollout.thinking:
        rollout, said = replace(rollout, thinking=True), said + ["thinking on (--thinking)"]
    if rendering.window is not None and rollout.context == ContextPolicy.FULL:
        whole = max(rollout.max_trajectory_tokens, rendering.whole or 0)
        rollout = replace(rollout, context=ContextPolicy.FOLD, context_window=rendering.window,
                          max_trajectory_tokens=whole)
        said.append(f"--context fold --context-window {rendering.window} --max-trajectory-tokens {whole}")
    if said and not quiet:
        click.echo(f"{', '.join(said)}, as the run trained (its checkpoint implies it)", err=True)
    return rollout


def checkpoint_of(run_dir: Path) -> RunCheckpoint:
    """The last checkpoint of the training run in ``run_dir`` (one line naming the problem if
    there is none)."""
    from searchr1.run.algorithm import algorithm_of
    from searchr1.run.directory import TWIN_HOME, RunDir

    run = RunDir(run_dir)
    config = run.open()
    last = run.resume_point()
    if last is None or not last.weights_path:
        raise click.ClickException(f"{run_dir} holds no checkpoint yet ({run_dir / 'checkpoints.jsonl'}); "
                                   "train at least until the first save")
    offline = bool(config.get("offline"))
    from searchr1.core.context import ContextPolicy

    rollout = config.get("rollout")
    rendering = RunRendering()
    if isinstance(rollout, dict):
        window, whole = rollout.get("context_window"), rollout.get("max_trajectory_tokens")
        if rollout.get("context") != ContextPolicy.FOLD or not isinstance(window, int):
            window = None
        rendering = RunRendering(rollout.get("thinking") is True, window,
                                 whole if window is not None and isinstance(whole, int) else None)
    return RunCheckpoint(last.weights_path, str(config.get("base_model") or "Qwen/Qwen3.5-4B"), offline,
                         run_dir / TWIN_HOME if offline else None,
                         str(config.get("offline_policy") or "") or None if offline else None, algorithm_of(config),
                         rendering)


def _sampling_client(service: pytrio.ServiceClient, base_model: str, model_path: str | None, *, offline: bool,
                     offline_home: Path | None) -> pytrio.SamplingClient:
    from searchr1.wiring.services import ServiceSetupError

    try:
        return service.create_sampling_client(base_model=base_model, model_path=model_path)
    except Exception as error:
        from pytrio import PyTrioError

        if not isinstance(error, PyTrioError):
            raise
        code = getattr(error, "code", "") or type(error).__name__
        hint = ""
        if offline and model_path:
            where = f"not in {offline_home}" if offline_home else "no --offline-home given"
            hint = (f"; a `train --offline` checkpoint needs --checkpoint RUN_DIR, or --offline-home "
                    f"runs/<run-name>/twin ({where})")
        raise ServiceSetupError(f"cannot create a sampler for {base_model}"
                                f"{' at ' + model_path if model_path else ''} ({code}){hint}") from None


def output_lock_path(output: Path) -> Path:
    """The lock file beside the file an eval output names once links are followed (hidden, so
    ``eval_result/*.jsonl`` never lists it): two spellings of one file share one lock."""
    target = Path(os.path.realpath(output))
    return target.with_name(f".{target.name}.lock")


def _claim_output(output: Path, held: contextlib.ExitStack) -> None:
    """Refuse an output that cannot be written, or that another eval is writing, before any
    work: the output is checked, then locked for the life of the command."""
    from searchr1.basics.fileio import check_writable, exclusive_lock

    check_writable(output, "eval output", click.ClickException)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.ClickException(f"cannot create the folder of eval output {output}: "
                                   f"{error.strerror or error}") from None
    try:
        held.enter_context(exclusive_lock(output_lock_path(output), f"eval output {output}"))
    except OSError as error:  # a full or read-only disk: name the output, not its hidden lock
        raise click.ClickException(f"cannot write eval output {output}: {error.strerror or error}") from None


@dataclass(frozen=True)
class _EvalFlags:
    """``eval``'s flags beside the rollout's and the search's; with ``--checkpoint`` the model,
    the mode and the twin's home are the checkpoint's (``checkpoint``)."""

    offline: bool
    quiet: bool
    overwrite: bool
    prices: PriceTable | None
    connect_timeout: float | None
    base_model: str
    model_path: str | None
    limit: int | None
    chat_template: str | None
    offline_home: Path | None
    offline_policy: str
    checkpoint_run: Path | None
    protocol: str | None
    judge_model: str | None
    judge_cache: str | None
    judge_cassette: Path | None
    checkpoint: RunCheckpoint | None = None


def _eval(search: SearchOptions, kwargs: dict[str, object], held: contextlib.ExitStack) -> None:
    """The flags made the runner's inputs, every check bad input can fail, the evaluation, and
    what it found."""
    from searchr1.commands.prerequisites import Prerequisites
    from searchr1.data.dataset import load_examples
    from searchr1.offline import DEV

    checks = Prerequisites()  # what is missing is said all at once, before the tokenizer loads
    flags = _eval_flags(kwargs, checks)
    if flags.protocol == "search-r1":
        search = apply_search_r1_protocol(kwargs, search, given=_given_flags())
    if flags.checkpoint_run is not None:
        flags = _with_checkpoint(flags)
    rollout = rollout_config_from(kwargs, seed=pop_flag(kwargs, "seed", int))
    if flags.checkpoint is not None:
        rollout = rollout_as_trained(rollout, flags.checkpoint.rendering, quiet=flags.quiet)
    given = pop_optional(kwargs, "data", Path)
    data = given or (DEV if flags.offline else PROTOCOL_DATA if flags.protocol else LIVE_DATA)
    _check_model_and_data(flags, rollout, data, given=given is not None, checks=checks)
    output = pop_optional(kwargs, "output", Path) or default_output(flags.base_model, flags.model_path,
                                                                    search.backend, flags.offline, flags.offline_policy)
    checks.check(_claim_output, output, held)
    on_interrupt(f"eval interrupted (Ctrl-C) during start-up, before any question was evaluated; {output} is "
                 f"as it was, nothing in it lost: run the same command again to "
                 f"{'resume' if output.exists() else 'start'}")
    _check_services(flags, rollout, search, checks)  # before PyTRIO is contacted or anything written
    checks.raise_failures("the evaluation")
    examples = load_examples(data)  # every row, now that the first one passed
    run_config = _eval_run_config(flags, search, rollout, data)
    outcome = _run_evaluation(flags, search, rollout, examples, data, output, run_config)
    _report_outcome(flags, search, outcome, output, run_config)


def _eval_flags(kwargs: dict[str, object], checks: Prerequisites) -> _EvalFlags:
    """Take ``eval``'s own flags out of ``kwargs``; a bad ``--prices`` table goes to ``checks``
    (one line, before anything is sampled)."""
    offline, quiet = pop_flag(kwargs, "offline", bool), pop_flag(kwargs, "quiet", bool)
    overwrite = pop_flag(kwargs, "overwrite", bool)
    prices_path = pop_optional(kwargs, "prices", Path)
    if prices_path is not None:
        from searchr1.run.costs import load_prices

        prices = checks.check(load_prices, prices_path)  # a bad table is one line, before anything is sampled
    else:
        prices = None
    return _EvalFlags(
        offline=offline, quiet=quiet, overwrite=overwrite, prices=prices,
        connect_timeout=pop_optional(kwargs, "connect_timeout", float), base_model=pop_flag(kwargs, "base_model", str),
        model_path=pop_optional(kwargs, "model_path", str), limit=pop_optional(kwargs, "limit", int),
        chat_template=pop_optional(kwargs, "chat_template", str),
        offline_home=pop_optional(kwargs, "offline_home", Path), offline_policy=pop_flag(kwargs, "offline_policy", str),
        checkpoint_run=pop_optional(kwargs, "checkpoint_run", Path), protocol=pop_optional(kwargs, "protocol", str),
        judge_model=pop_optional(kwargs, "judge_model", str), judge_cache=pop_optional(kwargs, "judge_cache", str),
        judge_cassette=pop_optional(kwargs, "judge_cassette", Path))


def _with_checkpoint(flags: _EvalFlags) -> _EvalFlags:
    """``--checkpoint RUN_DIR``: the run's last weights, its base model, its mode and, offline, its
    twin's home and policy; refused beside ``--model-path`` or ``--offline-home``."""
    assert flags.checkpoint_run is not None
    if flags.model_path is not None or flags.offline_home is not None:
        raise click.UsageError("--checkpoint picks the model path (and, offline, the twin's home); "
                               "do not combine it with --model-path or --offline-home")
    checkpoint = checkpoint_of(flags.checkpoint_run)
    return replace(flags, offline=checkpoint.offline, base_model=checkpoint.base_model,
                   model_path=checkpoint.weights_path, offline_home=checkpoint.offline_home,
                   offline_policy=checkpoint.offline_policy or flags.offline_policy, checkpoint=checkpoint)


def _check_model_and_data(flags: _EvalFlags, rollout: RolloutConfig, data: Path, *, given: bool,
                          checks: Prerequisites) -> None:
    """Refuse a twin's home without ``--offline``, a group the offline script cannot serve and an
    unknown base model; the eval data's first line goes to ``checks``."""
    from searchr1.commands.prerequisites import check_examples_file
    from searchr1.wiring.services import check_base_model

    if flags.offline_home is not None and not flags.offline:
        raise click.UsageError("--offline-home only applies with --offline")
    if flags.offline:
        check_offline_group_size(flags.offline_policy, rollout.group_size)
    check_base_model(flags.base_model)
    hint = ("" if given
            else f"; run `{invocation.command('prepare-data')}` first, or pass --data" if not flags.offline
            else "; reinstall the package")
    checks.check(check_examples_file, data, what="eval data", missing_hint=hint,
                 empty=f"eval data {data} holds no questions")


def _check_services(flags: _EvalFlags, rollout: RolloutConfig, search: SearchOptions, checks: Prerequisites) -> None:
    """Into ``checks``: the search setup and keys, the tools, the judge and the PyTRIO key."""
    from searchr1.commands.prerequisites import check_pytrio
    from searchr1.wiring.services import check_search_setup, check_tool_setup

    checks.check(check_search_setup, search, offline=flags.offline)
    checks.check(check_tool_setup, rollout.tools, search)
    if flags.judge_model is not None:
        checks.check(check_judge, flags.judge_model, offline=flags.offline, cassette=flags.judge_cassette,
                     env_file=search.env_file)
    if not flags.offline:
        check_pytrio(checks)


def _sampled_label(flags: _EvalFlags) -> str:
    """What the output names as the policy evaluated: the model, or offline the twin's policy."""
    if not flags.offline:
        return flags.model_path or flags.base_model
    from searchr1.twin.policies import offline_policy_label

    return offline_policy_label(flags.offline_policy) + (f" at {flags.model_path}" if flags.model_path
                                                         else " (untrained)")


def _eval_run_config(flags: _EvalFlags, search: SearchOptions, rollout: RolloutConfig,
                     data: Path) -> dict[str, object]:
    """The output's configuration: :func:`build_run_config`, the protocol, how a checkpoint was
    trained and the judge."""
    run_config = build_run_config(offline=flags.offline, base_model=flags.base_model, model_path=flags.model_path,
                                  search=search, rollout=rollout, data=data, limit=flags.limit,
                                  chat_template=flags.chat_template, offline_home=flags.offline_home,
                                  offline_policy=flags.offline_policy)
    if flags.protocol:
        run_config["protocol"] = flags.protocol
    if flags.checkpoint is not None:
        run_config["trained_with"] = flags.checkpoint.algorithm  # shown in the summary, not binding on resume
    if flags.judge_model is not None:
        from searchr1.evaluation.judge import JUDGE_PROMPT_VERSION

        run_config["judge"] = {"model": flags.judge_model, "prompt_version": JUDGE_PROMPT_VERSION}
    return run_config


def _run_evaluation(flags: _EvalFlags, search: SearchOptions, rollout: RolloutConfig, examples: list[SearchExample],
                    data: Path, output: Path, run_config: dict[str, object]) -> EvalOutcome:
    """The evaluation on the service (the twin at home in a scratch folder unless one is named);
    a failure says what the output kept: exit 130 on Ctrl-C, one line for a bad file, a judge's
    or the service's failure."""
    from searchr1.evaluation.evaluate import EvalResumeError, evaluate
    from searchr1.evaluation.judge import JudgeError
    from searchr1.evaluation.metrics import EvalFileError
    from searchr1.wiring.services import load_tokenizer, open_search, start_service, tool_backends

    tokenizer = load_tokenizer(flags.chat_template)
    with tempfile.TemporaryDirectory(prefix="searchr1-eval-") as scratch:
        home = flags.offline_home or Path(scratch)
        service = start_service(tokenizer, offline=flags.offline, home=home, policy=flags.offline_policy,
                                connect_timeout=flags.connect_timeout,
                                sampling_concurrency=rollout.sampling_concurrency)
        sampler = _sampling_client(service, flags.base_model, flags.model_path, offline=flags.offline,
                                   offline_home=flags.offline_home)
        bar = None if flags.quiet else _Bar()

        async def main() -> EvalOutcome:
            judge = (None if flags.judge_model is None else
                     make_judge(flags.judge_model, service=service, tokenizer=tokenizer, base_model=flags.base_model,
                                offline=flags.offline, cassette=flags.judge_cassette, cache=flags.judge_cache,
                                env_file=search.env_file))
            try:
                async with open_search(search, offline=flags.offline) as backend:
                    return await evaluate(sampler, tokenizer, backend, examples, rollout, output, run_config,
                                          limit=flags.limit, overwrite=flags.overwrite, progress=bar, judge=judge,
                                          prices=flags.prices, tool_backends=tool_backends(rollout.tools, backend))
            finally:
                if judge is not None and hasattr(judge.backend, "aclose"):
                    await judge.backend.aclose()

        click.echo(f"eval: {data} -> {output}  ({'offline twin' if flags.offline else 'live PyTRIO'}, "
                   f"{_sampled_label(flags)}, backend {search.backend})", err=True)
        on_interrupt(f"eval interrupted (Ctrl-C); the records already in {output} are kept: run the same command "
                     "again to resume")
        try:
            return asyncio.run(main())
        except (EvalFileError, EvalResumeError) as error:
            raise click.ClickException(str(error)) from None
        except JudgeError as error:
            if bar is not None:
                bar.close()
            _report_interrupted(output, error)
            raise click.ClickException(str(error)) from None
        except BaseException as error:
            if bar is not None:
                bar.close()
            if _report_interrupted(output, error) and isinstance(error, KeyboardInterrupt):
                sys.exit(130)  # it said what is kept and how to resume; the shell's code for SIGINT
            from searchr1.runtime.failures import describe_failure, is_service_failure

            if isinstance(error, Exception) and is_service_failure(error):
                raise click.ClickException(f"the service or the network failed ({describe_failure(error)})") from None
            raise
        finally:
            if bar is not None:
                bar.close()


def _report_outcome(flags: _EvalFlags, search: SearchOptions, outcome: EvalOutcome, output: Path,
                    run_config: dict[str, object]) -> None:
    """What the evaluation found: its notes, the summary (with ``--protocol search-r1``, beside the
    published rows and the card), where the results are; questions whose sampling failed are named
    and the command exits 1."""
    from searchr1.basics.wording import plural

    for note in outcome.notes:
        click.echo(f"note: {note}", err=True)
    judged = f", {outcome.judged} judged" if flags.judge_model is not None else ""  # kept questions are judged too
    click.echo(f"{plural(outcome.evaluated, 'question')} evaluated{judged}, {outcome.skipped} already in {output}",
               err=True)
    if outcome.summary is not None:
        click.echo(format_summary(outcome.summary))
        if flags.protocol == "search-r1":
            from searchr1.evaluation.published import comparison_table

            from searchr1.basics.secrets import redact_url

            shown_url = redact_url(search.retriever_url) if search.retriever_url else "the default URL"
            retriever = (f"BM25 over {run_config.get('search_index')}" if search.backend == "local"
                         else f"the retrieval server at {shown_url}")
            click.echo(comparison_table(outcome.summary["metrics"], model=_sampled_label(flags), retriever=retriever,
                                        offline=flags.offline))
            from searchr1.evaluation.card import format_card

            click.echo(format_card(outcome.summary["card"]))
    click.echo(f"results: {output}")
    if outcome.failed:
        click.secho(f"sampling failed for {plural(len(outcome.failed), 'question')} ({', '.join(outcome.failed[:5])}"
                    f"{', …' if len(outcome.failed) > 5 else ''}); the summary is partial. Rerun the same "
                    "command to retry them.", fg="yellow", err=True)
        sys.exit(1)


def check_judge(model: str, *, offline: bool, cassette: Path | None, env_file: Path | None) -> None:
    """Refuse a judge that cannot run here, before any work (one line naming the flag)."""
    from searchr1.evaluation.judge import DEEPSEEK_PREFIX, TWIN_JUDGE

    if model == TWIN_JUDGE and not offline:
        raise click.UsageError("--judge twin is the offline twin's judge; use it with --offline")
    if model.startswith(DEEPSEEK_PREFIX):
        if offline and cassette is None:
            raise click.UsageError(f"--judge {model} offline replays a cassette: pass --judge-cassette PATH")
        if offline and cassette is not None and not cassette.is_file():
            raise click.UsageError(f"--judge-cassette {cassette} does not exist")
        if not offline:
            from searchr1.search.env import require_keys

            require_keys(("DEEPSEEK_API_KEY",), env_file=env_file)
        return
    if cassette is not None:
        raise click.UsageError("--judge-cassette applies to a deepseek-* judge")
    if offline and model != TWIN_JUDGE:
        raise click.UsageError(f"--judge {model} offline: the offline judge is 'twin' (or a deepseek-* model "
                               "replayed with --judge-cassette)")


def deepseek_transport() -> httpx.AsyncBaseTransport:
    """The live DeepSeek judge's own transport (two retries), under the recording one with
    ``--judge-cassette``. A test replaces this function with a fake DeepSeek (an
    ``httpx.MockTransport``) to record a cassette without the network."""
    import httpx

    return httpx.AsyncHTTPTransport(retries=2)


def make_judge(model: str, *, service: pytrio.ServiceClient, tokenizer: Qwen35Tokenizer, base_model: str, offline: bool,
               cassette: Path | None, cache: str | None, env_file: Path | None) -> Judge:
    """The :class:`~searchr1.evaluation.judge.Judge` that ``--judge MODEL`` names."""
    from searchr1.evaluation.judge import (
        DEEPSEEK_PREFIX,
        TWIN_JUDGE,
        DeepSeekJudge,
        Judge,
        JudgeCache,
        PyTrioJudge,
        cache_path,
    )

    judge_cache = JudgeCache(cache_path(cache))
    if model.startswith(DEEPSEEK_PREFIX):
        import httpx

        if offline:
            from searchr1.search.replay import CassetteTransport

            client = httpx.AsyncClient(transport=CassetteTransport(cassette), timeout=60.0)
            return Judge(DeepSeekJudge(model, client, None), judge_cache)
        from searchr1.search.env import require_keys

        key = require_keys(("DEEPSEEK_API_KEY",), env_file=env_file)[0]
        transport = deepseek_transport()
        if cassette is not None:  # live with a cassette: recorded (written as the judge closes)
            from searchr1.evaluation.judge_recording import RecordingTransport

            transport = RecordingTransport(cassette, secrets=[key], inner=transport)
        return Judge(DeepSeekJudge(model, httpx.AsyncClient(transport=transport, timeout=60.0), key), judge_cache)
    from pytrio import PyTrioError

    from searchr1.wiring.services import ServiceSetupError

    try:
        sampler = service.create_sampling_client(base_model=base_model if model == TWIN_JUDGE else model)
    except PyTrioError as error:
        code = getattr(error, "code", "") or type(error).__name__
        raise ServiceSetupError(f"--judge {model}: cannot create a sampler for the judge ({code})") from None
    return Judge(PyTrioJudge(sampler, tokenizer, model), judge_cache)


def _given_flags() -> set[str]:
    """Parameter names the user set on the command line (not defaults)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return set()
    return {name for name in context.params
            if context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}


def apply_search_r1_protocol(kwargs: dict[str, object], search: SearchOptions, *, given: set[str]) -> SearchOptions:
    """Set the Search-R1 protocol's rollout flags in ``kwargs`` and its retrieval in ``search``;
    a flag the user set to another value is a one-line usage error naming it."""
    from dataclasses import replace

    if search.backend not in SEARCH_R1_BACKENDS:
        raise click.UsageError(f"--protocol search-r1 retrieves wiki-18 passages: use --backend local (with "
                               f"--index) or --backend retriever, not {search.backend}")
    for name, value in SEARCH_R1_SETTINGS.items():
        if name in given and kwargs[name] != value:
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"--protocol search-r1 fixes {flag} {value:g}; drop {flag} {kwargs[name]:g}")
        kwargs[name] = value
    if search.topk is not None and search.topk != SEARCH_R1_TOPK:
        raise click.UsageError(f"--protocol search-r1 fixes --search-topk {SEARCH_R1_TOPK}; drop --search-topk "
                               f"{search.topk}")
    return replace(search, topk=SEARCH_R1_TOPK)


def _report_interrupted(output: Path, error: BaseException) -> bool:
    """Say what survived (records and a partial summary) and how to continue; False when the
    output could not be read to say it."""
    from searchr1.evaluation.evaluate import read_existing

    try:
        existing = read_existing(output)
    except Exception:  # noqa: BLE001 - best effort; the original error is what matters
        return False
    from searchr1.runtime.failures import is_service_failure

    transient = isinstance(error, KeyboardInterrupt) or (isinstance(error, Exception) and is_service_failure(error))
    what = "eval interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else "eval stopped by an error"
    summary = "a partial summary" if existing.summary is not None else "no summary (nothing finished)"
    then = ("rerun the same command to resume" if transient
            else "fix the error below, then rerun the same command to resume")
    from searchr1.basics.wording import plural

    click.secho(f"{what}: {plural(len(existing.records), 'record')} kept in {output} with {summary}; {then}",
                fg="yellow", err=True)
    return True


def _search_success(metrics: Mapping[str, object]) -> str:
    """The share of searches that succeeded, or a dash when nothing was searched (0 of 0 is not
    a success rate of 0)."""
    searched = metrics.get("search/requests") or metrics.get("rollout/search_calls")
    if not searched or "search/success_rate" not in metrics:
        return "- (no searches)"
    return f"{metrics['search/success_rate']:.3f}"


def format_summary(summary: Mapping[str, object]) -> str:
    """The console view of a summary: macro/micro EM, F1 and cover EM with intervals, format,
    per-source table (F1 and cover EM only when the summary has them: older files do not), its
    sources with fewer than FEW_QUESTIONS questions marked ``*`` and a footnote saying why."""
    from searchr1.evaluation.intervals import FEW_QUESTIONS, few_questions

    m = as_object(summary["metrics"], "metrics")
    sources = sorted(key.split("/", 1)[1] for key in m if key.startswith("questions/"))
    names = [(n, label) for n, label in (("em", "EM"), ("f1", "F1"), ("cover_em", "cover EM"), ("judge", "judge"))
             if f"{n}/macro" in m]
    from searchr1.basics.wording import plural

    head = "PARTIAL " if summary.get("partial") else ""
    evaluated = summary.get("evaluated_examples")
    lines = [
        (f"{head}summary over "
         f"{plural(evaluated, 'question') if isinstance(evaluated, int) else f'{evaluated} questions'} "
         f"({summary.get('questions_missing', 0)} of {summary.get('questions_planned', '?')} planned missing)"),
    ]
    config = summary.get("config")
    trained_with = config.get("trained_with") if isinstance(config, Mapping) else None
    if isinstance(trained_with, dict):
        from searchr1.run.algorithm import describe_algorithm

        lines.append(f"  checkpoint trained with {describe_algorithm(trained_with)}")
    for name, label in names:
        lines.append(
            f"  macro {label} {m[f'{name}/macro']:.3f} [{m[f'{name}/macro_ci95_low']:.3f}, "
            f"{m[f'{name}/macro_ci95_high']:.3f}]   micro {label} {m[f'{name}/micro']:.3f} "
            f"[{m[f'{name}/micro_ci95_low']:.3f}, {m[f'{name}/micro_ci95_high']:.3f}]"
            + (f"   format {m['format/rate']:.3f}" if name == "em" else ""))
    lines.append(
        f"  searches/question {m['rollout/search_calls']:.2f}   no-search rate {m['rollout/no_search_rate']:.2f}   "
        f"turns {m['rollout/turns']:.2f}   search success {_search_success(m)}")
    if "usage/total_model_tokens" in m:
        parts = [f"{m['usage/total_model_tokens']:.0f} model tokens "
                 f"({m['usage/model_tokens_per_question']:.0f}/question)",
                 f"{m.get('usage/total_sample_requests', 0):.0f} sampling requests"]
        parts += [f"{m[key]:.0f} {key.removeprefix('usage/total_search_').removesuffix('_calls')} searches"
                  for key in sorted(m) if key.startswith("usage/total_search_") and key.endswith("_calls")]
        parts += [f"{m[key]:.0f} {key.removeprefix('usage/total_tool_').removesuffix('_calls')} calls"
                  for key in sorted(m) if key.startswith("usage/total_tool_") and key.endswith("_calls")]
        cost = (f"; cost {m['cost/total']:.4f} {summary.get('currency', '')} ({m['cost/per_question']:.4f}/question)"
                if "cost/total" in m else "")
        lines.append("  usage: " + ", ".join(parts) + cost)
    lines.append(f"  {'source':<18}{'n':>5}" + "".join(f"{label:>10}   {'95% CI':<15}" for _, label in names)
                 + f"{'format':>7}")
    few = [source for source in sources if few_questions(_count(m, f"questions/{source}"))]
    for source in sources:
        cells = "".join(
            f"{m[f'{name}/{source}']:>10.3f}   [{m[f'{name}_ci95_low/{source}']:.3f}, "
            f"{m[f'{name}_ci95_high/{source}']:.3f}] " for name, _ in names)
        named = f"{source}*" if source in few else source
        lines.append(f"  {named:<18}{_count(m, f'questions/{source}'):>5}{cells}{m[f'format/{source}']:>7.3f}")
    if few:
        lines.append(f"  * fewer than {FEW_QUESTIONS} questions: a wide interval, and one question moves the score "
                     f"by {1 / FEW_QUESTIONS:.1f} or more; read it with care")
    return "\n".join(lines)


def _count(metrics: Mapping[str, object], key: str) -> int:
    """A count among the metrics (a number as JSON holds it)."""
    return int(as_float(metrics[key], key))

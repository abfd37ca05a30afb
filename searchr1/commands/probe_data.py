"""``probe-data``: each question's pass rate closed-book and with tools, by a chosen policy, into a
file ``train --probe`` reads (:mod:`searchr1.evaluation.probe`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from searchr1.basics import invocation
from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.options import (connect_timeout_option, on_interrupt, rollout_config_from, rollout_options,
                                       run_guarded)
from searchr1.commands.search_options import search_options
from searchr1.commands.settings_options import pop_flag, pop_optional
from searchr1.offline import OfflinePolicy
from searchr1.search.options import SearchOptions

if TYPE_CHECKING:
    from searchr1.commands.eval import RunCheckpoint
    from searchr1.commands.prerequisites import Prerequisites
    from searchr1.runtime.tokenizer import Qwen35Tokenizer
    from searchr1.core.rollout import RolloutConfig
    from searchr1.core.types import SearchExample
    from searchr1.evaluation.probe import ProbeOutcome
    from searchr1.run.costs import Budget, PriceTable

LIVE_DATA = Path("datasets/train.jsonl")
OFFLINE_OUTPUT_DIR = Path("probe_result")  # the shipped offline data's probes (not inside the package)
BUDGET_EXIT = 4  # as train's budget stop


def default_output(data: Path) -> Path:
    """Beside the dataset (``train.jsonl`` -> ``train.probe.jsonl``); the shipped offline data's
    probe goes to ``probe_result/`` rather than into the installed package."""
    from searchr1.offline import OFFLINE_DIR

    name = f"{data.name.removesuffix('.jsonl')}.probe.jsonl"
    if data.resolve().parent == OFFLINE_DIR:
        return OFFLINE_OUTPUT_DIR / f"offline_{name}"
    return data.with_name(name)


@click.command("probe-data", cls=SectionedCommand, context_settings={"show_default": True})
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="No key, no network: the offline twin's learning policy and the backend's search cassette.")
@click.option("--data", cls=SectionOption, section="run", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Dataset JSONL to probe [default: datasets/train.jsonl; offline the shipped mixed_train.jsonl, "
                   "whose known questions the base twin answers without searching].")
@click.option("--output", "-o", cls=SectionOption, section="run", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Probe JSONL to write or resume [default: beside the data, <name>.probe.jsonl].")
@click.option("--overwrite", cls=SectionOption, section="run", is_flag=True,
              help="Start the output afresh; without it an existing output is resumed (refused if other settings "
                   "produced it).")
@click.option("--attempts", cls=SectionOption, section="run", type=click.IntRange(1, 256), default=8,
              help="Attempts per question, closed-book (no tool offered, one turn) and with the tools each.")
@click.option("--limit", cls=SectionOption, section="run", type=click.IntRange(min=1), default=None,
              help="Probe only the first N questions of the data [default: all].")
@click.option("--base-model", cls=SectionOption, section="run", default="Qwen/Qwen3.5-4B")
@click.option("--checkpoint", "checkpoint_run", cls=SectionOption, section="run",
              type=click.Path(file_okay=False, path_type=Path), default=None, metavar="RUN_DIR",
              help="Probe with the last checkpoint of this training run instead of the base model.")
@click.option("--estimate", cls=SectionOption, section="cost", is_flag=True,
              help="Print what the probe would use and cost, then stop (nothing is sampled).")
@click.option("--prices", cls=SectionOption, section="cost", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE", help="TOML price table (docs/prices.example.toml): the estimate's and the "
                                                 "summary's cost.")
@click.option("--budget", cls=SectionOption, section="cost", type=click.FloatRange(min=0.0, min_open=True),
              default=None, metavar="AMOUNT",
              help="Stop (exit code 4, every finished question kept) before a chunk of questions projected to pass "
                   "this cost; needs --prices.")
@click.option("--budget-tokens", cls=SectionOption, section="cost", type=click.IntRange(min=1), default=None,
              metavar="N", help="Stop (exit code 4) before a chunk projected to pass this many model tokens.")
@rollout_options(group_size=8, temperature=1.0, exclude=("group_size",))
@click.option("--seed", cls=SectionOption, section="run", type=int, default=42,
              help="Sampling seeds (with each question's position in the data).")
@click.option("--quiet", cls=SectionOption, section="logging", is_flag=True, help="No progress bar.")
@connect_timeout_option()
@search_options(default_backend="deepseek")
def probe_data(search: SearchOptions, **kwargs: object) -> None:
    """Measure each question's difficulty for a policy: N attempts closed-book (no tool offered)
    and N with the tools, and write the pass rates beside the dataset, with the policy and the
    settings that produced them. `train --probe FILE` reads the file: --drop-guessable K leaves out
    questions answered right closed-book in at least K attempts, --drop-solved those solved with
    tools in all N, and --curriculum starts from the pass rates.

    \b
    Offline:     %(prog)s probe-data --offline
    Base model:  %(prog)s probe-data --backend zhihu --prices prices.toml --budget 5
    Checkpoint:  %(prog)s probe-data --backend zhihu --checkpoint runs/<run-name>

    The cost is estimated before anything is sampled (--estimate prints it and stops). Each
    question's line is written as it finishes; an interrupted probe keeps them, and the same
    command resumes it.
    """
    with contextlib.ExitStack() as held:
        run_guarded(lambda: _probe(search, kwargs, held))


def _probe(search: SearchOptions, kwargs: dict[str, object], held: contextlib.ExitStack) -> None:
    from searchr1.commands.eval import _claim_output, checkpoint_of, rollout_as_trained
    from searchr1.commands.prerequisites import Prerequisites, check_examples_file
    from searchr1.data.dataset import load_examples
    from searchr1.offline import MIXED_TRAIN

    checks = Prerequisites()
    offline, quiet, overwrite = (pop_flag(kwargs, name, bool) for name in ("offline", "quiet", "overwrite"))
    attempts = pop_flag(kwargs, "attempts", int)
    rollout = rollout_config_from(kwargs, seed=pop_flag(kwargs, "seed", int), group_size=attempts)
    checkpoint_run = pop_optional(kwargs, "checkpoint_run", Path)
    checkpoint = checkpoint_of(checkpoint_run) if checkpoint_run is not None else None
    if checkpoint is not None:
        offline = checkpoint.offline
        rollout = rollout_as_trained(rollout, checkpoint.rendering, quiet=quiet)
    base_model = checkpoint.base_model if checkpoint is not None else pop_flag(kwargs, "base_model", str)
    given = pop_optional(kwargs, "data", Path)
    data = given or (MIXED_TRAIN if offline else LIVE_DATA)
    checks.check(check_examples_file, data, what="probe data",
                 missing_hint="" if given else f"; run `{invocation.command('prepare-data')}` first, or pass --data",
                 empty=f"probe data {data} holds no questions")
    prices, budget = _prices_and_budget(kwargs, checks)
    output = pop_optional(kwargs, "output", Path) or default_output(data)
    limit = pop_optional(kwargs, "limit", int)
    estimate_only = pop_flag(kwargs, "estimate", bool)
    if not estimate_only:
        checks.check(_claim_output, output, held)
    _check_services(rollout, search, offline=offline, checks=checks)
    checks.raise_failures("the probe")
    examples = load_examples(data)
    planned = list(enumerate(examples))[:limit]
    config = _probe_config(offline, base_model, checkpoint.weights_path if checkpoint else None, search, rollout,
                           data, limit)
    from searchr1.wiring.services import load_tokenizer

    tokenizer = load_tokenizer(None)
    click.echo(_estimate_text(rollout, tokenizer, [e for _, e in planned], search, prices), err=True)
    if estimate_only:
        return
    outcome = _run(offline, base_model, checkpoint, search, rollout, tokenizer, examples, planned, output, config,
                   overwrite=overwrite, quiet=quiet, prices=prices, budget=budget,
                   connect_timeout=pop_optional(kwargs, "connect_timeout", float))
    _report(outcome, output, budget, prices)


def _prices_and_budget(kwargs: dict[str, object], checks: Prerequisites) -> tuple[PriceTable | None, Budget]:
    from searchr1.run.costs import Budget, load_prices

    prices_path = pop_optional(kwargs, "prices", Path)
    prices = checks.check(load_prices, prices_path) if prices_path is not None else None
    budget = Budget(pop_optional(kwargs, "budget", float), pop_optional(kwargs, "budget_tokens", int))
    if budget.amount is not None and prices_path is None:
        raise click.UsageError("--budget is an amount in a price table's currency: add --prices FILE")
    return prices, budget


def _check_services(rollout: RolloutConfig, search: SearchOptions, *, offline: bool, checks: Prerequisites) -> None:
    from searchr1.commands.prerequisites import check_pytrio
    from searchr1.wiring.services import check_search_setup, check_tool_setup

    checks.check(check_search_setup, search, offline=offline)
    checks.check(check_tool_setup, rollout.tools, search)
    if not offline:
        check_pytrio(checks)


def _probe_config(offline: bool, base_model: str, model_path: str | None, search: SearchOptions,
                  rollout: RolloutConfig, data: Path, limit: int | None) -> dict[str, object]:
    """What produced the probe: the policy (offline the twin's, never the model's), the settings of
    both attempts and the dataset's sha256; everything but the code version and ``limit`` binds a
    resumed probe."""
    from dataclasses import asdict

    from searchr1.basics.fileio import file_sha256
    from searchr1.commands.eval import code_version
    from searchr1.evaluation.probe import closed_book
    from searchr1.twin.policies import offline_policy_label

    policy = (offline_policy_label(OfflinePolicy.LEARNING) + (f" at {model_path}" if model_path else " (untrained)")
              if offline else model_path or base_model)
    return {"policy": policy, "offline": offline, "base_model": base_model, "model_path": model_path,
            "search_backend": search.backend, "attempts": rollout.group_size, "reward": "em",
            "with_tools": asdict(rollout), "closed_book": asdict(closed_book(rollout)),
            "dataset": str(data), "dataset_sha256": file_sha256(data), "limit": limit,
            "code_version": dict(code_version())}


def _estimate_text(rollout: RolloutConfig, tokenizer: Qwen35Tokenizer, examples: list[SearchExample],
                   search: SearchOptions, prices: PriceTable | None) -> str:
    """What the probe would use, from sizes alone: both attempts' ranges for every question."""
    from searchr1.evaluation.probe import closed_book
    from searchr1.run.estimate import configured_estimate, render_estimate

    questions = max(1, len(examples))
    parts = [configured_estimate(_Plan(config, questions, search.backend), tokenizer, examples)
             for config in (closed_book(rollout), rollout)]
    estimate = parts[0]
    for usage_of in ("step_low", "step_high", "run_low", "run_high"):
        total = getattr(parts[0], usage_of)
        total.add(getattr(parts[1], usage_of))
        for kind in ("train_tokens", "forward_backward_calls", "optim_steps", "weight_saves", "state_saves"):
            setattr(total, kind, 0)  # a probe trains and saves nothing
    estimate.notes = [f"{questions} questions x {rollout.group_size} attempts, closed-book and with tools; "
                      "a 'step' is one question"] + parts[1].notes
    return render_estimate(estimate, prices)


class _Plan:
    """A probe as :func:`searchr1.run.estimate.configured_estimate` reads a run: one question a step."""

    def __init__(self, rollout: RolloutConfig, questions: int, backend: str) -> None:
        self.rollout, self.max_steps, self.search = rollout, questions, {"backend": backend}
        self.questions_per_batch, self.save_every, self.accumulation, self.kl_coef = 1, 0, "sdk", 0.0


def _run(offline: bool, base_model: str, checkpoint: RunCheckpoint | None, search: SearchOptions,
         rollout: RolloutConfig, tokenizer: Qwen35Tokenizer, examples: list[SearchExample],
         planned: list[tuple[int, SearchExample]], output: Path, config: dict[str, object], *, overwrite: bool,
         quiet: bool, prices: PriceTable | None, budget: Budget, connect_timeout: float | None) -> ProbeOutcome:
    from searchr1.commands.eval import _Bar, _sampling_client
    from searchr1.evaluation.probe import ProbeRunner, probe_dataset
    from searchr1.wiring.services import open_search, start_service, tool_backends

    home = checkpoint.offline_home if checkpoint is not None else None
    model_path = checkpoint.weights_path if checkpoint is not None else None
    with tempfile.TemporaryDirectory(prefix="searchr1-probe-") as scratch:
        service = start_service(tokenizer, offline=offline, home=home or Path(scratch), policy=OfflinePolicy.LEARNING,
                                connect_timeout=connect_timeout, sampling_concurrency=rollout.sampling_concurrency)
        sampler = _sampling_client(service, base_model, model_path, offline=offline, offline_home=home)
        bar = None if quiet else _Bar()

        async def main() -> ProbeOutcome:
            async with open_search(search, offline=offline) as backend:
                runner = ProbeRunner(sampler, tokenizer, backend, tool_backends(rollout.tools, backend), rollout,
                                     asyncio.Semaphore(rollout.sampling_concurrency))
                return await probe_dataset(runner, examples, output, config, planned=planned, overwrite=overwrite,
                                           progress=bar, prices=prices, budget=budget)

        click.echo(f"probe-data: {config['dataset']} -> {output}  ({config['policy']}, backend {search.backend})",
                   err=True)
        on_interrupt(f"probe interrupted (Ctrl-C); the questions already in {output} are kept: run the same command "
                     "again to resume")
        try:
            return asyncio.run(main())
        except BaseException as error:
            from searchr1.evaluation.probe import ProbeFileError
            from searchr1.runtime.failures import describe_failure, is_service_failure

            if isinstance(error, ProbeFileError):
                raise click.ClickException(str(error)) from None
            if isinstance(error, KeyboardInterrupt):
                click.echo(f"probe interrupted; the questions already in {output} are kept: run the same command "
                           "again to resume", err=True)
                sys.exit(130)
            if isinstance(error, Exception) and is_service_failure(error):
                raise click.ClickException(f"the service or the network failed ({describe_failure(error)}); the "
                                           f"questions already in {output} are kept: rerun to resume") from None
            raise
        finally:
            if bar is not None:
                bar.close()


def _report(outcome: ProbeOutcome, output: Path, budget: Budget, prices: PriceTable | None) -> None:
    from searchr1.basics.wording import plural

    summary = outcome.summary or {}
    click.echo(f"{plural(outcome.probed, 'question')} probed, {outcome.skipped} already in {output}", err=True)
    click.echo(f"closed-book pass rate {summary.get('closed_book_rate', 0.0):.3f}, with tools "
               f"{summary.get('with_tools_rate', 0.0):.3f}; answered right closed-book at least once: "
               f"{summary.get('closed_book_any_right', 0)}, solved with tools in every attempt: "
               f"{summary.get('with_tools_all_right', 0)} (of {summary.get('questions', 0)})")
    click.echo(f"results: {output}  (use: {invocation.command(f'train --probe {output} --drop-guessable 1')})")
    if outcome.failed:
        click.secho(f"sampling failed for {plural(len(outcome.failed), 'question')}; rerun the same command to retry "
                    "them", fg="yellow", err=True)
        sys.exit(1)
    if outcome.budget is not None:
        verdict = outcome.budget
        unit = prices.currency if prices is not None and verdict.what == "cost" else verdict.what
        click.echo(f"budget reached after {plural(outcome.skipped + outcome.probed, 'question')}: spent "
                   f"{verdict.spent:.4g} {unit}, {verdict.left:.4g} left, the next chunk would take about "
                   f"{verdict.projected_step:.4g}; every finished question is kept: rerun with a larger budget to "
                   "go on", err=True)
        sys.exit(BUDGET_EXIT)

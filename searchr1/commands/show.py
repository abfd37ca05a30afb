"""``show``: read transcripts in the terminal, or write them as one HTML page.

The source is a run directory (its ``transcripts.jsonl``: a sample of every training step), a
``transcripts.jsonl`` itself, or an eval JSONL file (one transcript per question).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.offline import OfflinePolicy
from searchr1.run.algorithm import algorithm_of, describe_algorithm

DEFAULT_LIMIT = 20


class StepType(click.ParamType):
    """A step number (>= 0) or ``all``."""

    name = "N|all"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int):
            return value
        if value == "all":
            return "all"
        text = str(value).strip().lower()
        if text == "all":
            return "all"
        try:
            number = int(text)
        except ValueError:
            self.fail(f"{value!r} is neither a step number nor 'all'", param, ctx)
        if number < 0:
            self.fail(f"steps count from 0, got {number}", param, ctx)
        return number


@dataclass
class Selection:
    heading: str
    sections: list[tuple[str | None, Sequence[Mapping[str, object]]]]  # transcript records, by step
    notes: list[str] = field(default_factory=list)
    shown: int = 0
    available: int = 0
    scores: dict[str, float] | None = None  # an eval's metrics over all its questions, for the page's summary
    scores_caption: str = ""


def offline_policy(config: Mapping[str, object]) -> str:
    """The twin policy a run or an evaluation used, as its configuration records it: a run's
    ``offline_policy``, an eval file's ``sampling_backend`` (``offline-<policy>``)."""
    policy = config.get("offline_policy")
    backend = str(config.get("sampling_backend") or "")
    if not policy and backend.startswith("offline-"):
        policy = backend.removeprefix("offline-")
    return str(policy or OfflinePolicy.SCRIPTED)  # files from before the learning policy existed


def _describe_config(config: Mapping[str, object] | None) -> str | None:
    if not config or not isinstance(config, dict):
        return None
    offline = bool(config.get("offline"))
    search = config.get("search")
    backend = config.get("search_backend") or (search.get("backend") if isinstance(search, dict) else None)
    model = config.get("model_path") or config.get("base_model")
    parts = [f"OFFLINE twin ({offline_policy(config)} policy, cassette search)" if offline else "live"]
    if model:
        parts.append(f"model {model}")
    if backend:
        parts.append(f"search {backend}")
    algorithm = config.get("trained_with") if "trained_with" in config else (
        algorithm_of(config) if "max_steps" in config else None)  # an eval of a checkpoint, or a training run
    if isinstance(algorithm, dict):
        parts.append(f"trained with {describe_algorithm(algorithm)}")
    return ", ".join(parts)


def _step_ranges(steps: list[int]) -> str:
    """``0-3, 7, 9-10``."""
    ranges: list[str] = []
    start: int | None = None
    previous: int | None = None
    for step in [*steps, None]:
        if start is not None and previous is not None and (step is None or step != previous + 1):
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if step is not None and start is None:
            start = step
        previous = step
    return ", ".join(ranges)


def select_from_run(transcripts_path: Path, run_dir: Path | None, step: int | str | None,
                    limit: int | None) -> Selection:
    from searchr1.basics.jsonl import JsonInputError, Surrogates, read_json_document
    from searchr1.evaluation.transcripts import read_run_transcripts

    found = read_run_transcripts(transcripts_path)
    if not found.by_step:
        raise click.ClickException(f"{transcripts_path} holds no transcripts yet")
    steps = found.steps
    if step is None:
        chosen = [steps[-1]]
    elif step == "all":
        chosen = steps
    elif step in found.by_step:
        chosen = [int(step)]
    else:
        raise click.ClickException(
            f"step {step} has no transcripts in {transcripts_path}; recorded steps: {_step_ranges(steps)}"
        )
    config = None
    if run_dir is not None and (run_dir / "config.json").is_file():
        try:
            config = read_json_document(run_dir / "config.json", surrogates=Surrogates.MEND)
        except (JsonInputError, OSError):
            config = None
    config = config if isinstance(config, dict) else None
    name = (config or {}).get("run_name") or (run_dir.name if run_dir else transcripts_path.parent.name)
    sections: list[tuple[str | None, Sequence[Mapping[str, object]]]] = []
    remaining = limit
    for number in chosen:
        records = found.by_step[number] if remaining is None else found.by_step[number][:remaining]
        if remaining is not None:
            remaining -= len(records)
        if records:
            sections.append((f"step {number}", records))
    available = sum(len(found.by_step[s]) for s in chosen)
    shown = sum(len(records) for _, records in sections)
    notes = [f"source: {transcripts_path}", f"steps recorded: {_step_ranges(steps)}"]
    described = _describe_config(config if isinstance(config, dict) else None)
    if described:
        notes.append(described)
    if found.torn_lines:
        notes.append(f"skipped unreadable line(s) {', '.join(map(str, found.torn_lines[:10]))}")
    return Selection(f"Transcripts of run {name}", sections, notes, shown, available)


def select_from_eval(path: Path, limit: int | None, ids: tuple[str, ...] = ()) -> Selection:
    from searchr1.evaluation.transcripts import read_eval_transcripts

    config, records = read_eval_transcripts(path)
    if not records:
        raise click.ClickException(f"{path} holds no transcripts (no trajectory records)")
    if ids:
        missing = [i for i in ids if i not in {str(r.get("id")) for r in records}]
        if missing:
            raise click.ClickException(f"{path} has no question with id {missing[0]!r}")
    scores, caption = _eval_scores(records)
    if ids:
        records = [r for r in records if str(r.get("id")) in ids]
    shown = records[:limit]
    notes = [f"source: {path}"]
    described = _describe_config(config)
    if described:
        notes.append(described)
    return Selection(f"Eval transcripts: {path.name}", [(None, shown)], notes, len(shown), len(records),
                     scores, caption)


def _eval_scores(records: Sequence[Mapping[str, object]]) -> tuple[dict[str, float] | None, str]:
    """The metrics of every question in an eval file (its intervals by today's rules) and a
    caption for them; (None, why) when the records do not aggregate (the page still shows them)."""
    from searchr1.evaluation.metrics import evaluation_metrics
    from searchr1.basics.wording import plural

    try:
        metrics = evaluation_metrics(records)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return None, f"no score summary: a record lacks a field the scores are computed from ({type(error).__name__})"
    return metrics, (f"over all {plural(int(metrics['eval/questions']), 'question')} of the file, whatever "
                     "this page shows; EM, F1 and cover EM as the eval summary defines them")


def load_selection(source: Path, step: int | str | None, limit: int | None, ids: tuple[str, ...] = ()) -> Selection:
    from searchr1.evaluation.transcripts import TRANSCRIPTS_FILE, TranscriptFileError, transcript_source_kind

    try:
        if ids and (source.is_dir() or transcript_source_kind(source) == "run"):
            raise click.UsageError(f"--id picks questions of an eval file; {source} is a training run's transcripts")
        if source.is_dir():
            path = source / TRANSCRIPTS_FILE
            if not path.is_file():
                raise click.ClickException(
                    f"{source} has no {TRANSCRIPTS_FILE}: not a run directory, or a run that has not "
                    "finished a step (or was trained before transcripts were recorded)"
                )
            return select_from_run(path, source, step, limit)
        kind = transcript_source_kind(source)
        if kind == "run":
            return select_from_run(source, source.parent, step, limit)
        if step is not None:
            raise click.UsageError(f"--step applies to a run's transcripts; {source} is an eval file (no steps)")
        return select_from_eval(source, limit, ids)
    except (TranscriptFileError, UnicodeDecodeError) as error:
        raise click.ClickException(f"{source}: {error}" if isinstance(error, UnicodeDecodeError)
                                   else str(error)) from None


@click.command("show", cls=SectionedCommand)
@click.argument("source", type=click.Path(exists=True, path_type=Path), metavar="RUN_DIR|EVAL_FILE")
@click.option("--step", type=StepType(), default=None,
              help="Training step to show, or 'all' [default: the last step with transcripts]. Run directories only.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help=f"Show at most this many transcripts [default: {DEFAULT_LIMIT} in the terminal, all in --html].")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write one self-contained HTML page here instead of printing.")
@click.option("--full", is_flag=True, help="Print long turns and observations whole (the page always has them whole).")
@click.option("--id", "ids", multiple=True, metavar="QUESTION_ID",
              help="Only this question of an eval file (repeatable), e.g. one that `compare` lists as flipped.")
def show(source: Path, step: int | str | None, limit: int | None, html_path: Path | None, full: bool,
         ids: tuple[str, ...]) -> None:
    """Read what the model did: turns, queries, observations, reward, EM and how each
    trajectory ended.

    \b
    %(prog)s show runs/offline-demo                  the last step's sample
    %(prog)s show runs/offline-demo --step all --html run.html
    %(prog)s show eval_result/offline_base.jsonl --limit 5
    %(prog)s show eval_result/offline_base.jsonl --id off-dev-03
    """
    from searchr1.basics.fileio import check_writable, is_write_failure, write_failure_line, write_text_atomically

    if html_path is not None:
        check_writable(html_path, "page", click.ClickException)  # before reading anything
    if limit is None:
        limit = None if html_path is not None else DEFAULT_LIMIT
    selection = load_selection(source, step, limit, ids)
    cut = selection.available - selection.shown
    counted = f"{selection.shown} of {selection.available} transcripts" if cut > 0 else f"{selection.shown} transcripts"
    if cut > 0:
        selection.notes.append(f"showing {counted} (--limit {limit}; raise it to see more)")
    from searchr1.view.terminal import legend

    explained = legend([record for _, records in selection.sections for record in records])
    if explained:
        selection.notes.append(explained)
    if html_path is not None:
        from searchr1.view.html import transcript_page

        from searchr1.view.html_scores import scores_section

        if selection.scores is None and selection.scores_caption:
            selection.notes.append(selection.scores_caption)
        scores = "" if selection.scores is None else scores_section(selection.scores, caption=selection.scores_caption)
        page = transcript_page(selection.sections, heading=selection.heading, notes=selection.notes, scores=scores)
        try:
            write_text_atomically(html_path, page)
        except OSError as error:
            if not is_write_failure(error):
                raise
            raise click.ClickException(write_failure_line(error)) from None
        click.echo(f"wrote {html_path} ({counted}{'; raise --limit' if cut > 0 else ''})")
        return
    from rich.console import Console
    from rich.text import Text

    from searchr1.view.terminal import print_transcripts, printable

    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or a file: whole lines, so that grep finds phrases
        console = Console(highlight=False, soft_wrap=True)
    console.print(Text(printable(selection.heading), style="bold"))
    for note in selection.notes:
        console.print(Text(printable(note), style="dim"))
    console.print()
    for name, records in selection.sections:
        if name is not None and len(selection.sections) > 1:
            console.rule(Text(printable(name), style="bold"))
        print_transcripts(console, records, full=full)

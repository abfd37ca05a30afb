"""``plot eval`` and ``plot run``: PNG figures from eval summaries and training metrics."""

from __future__ import annotations

from pathlib import Path

import click

from searchr1 import plots
from searchr1.eval_metrics import EvalFileError


@click.group("plot")
def plot() -> None:
    """Draw PNG figures from eval results or a training run (matplotlib, Agg, no display)."""


@plot.command("eval", short_help="EM per benchmark and macro EM/format rate across checkpoints.")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path), help="PNG to write."
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Checkpoint label, once per FILE in the same order [default: the config's model_path, else the file stem].",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Plot files whose search backend/concurrency/timeout/model or eval-set sha256 differ (marked in the title).",
)
def plot_eval(files: tuple[Path, ...], output: Path, labels: tuple[str, ...], allow_mixed: bool) -> None:
    """EM per benchmark and macro EM / format rate across checkpoints, from eval JSONL FILES
    (one per checkpoint; each file's last summary record is used)."""
    try:
        runs = plots.load_eval_runs(files, labels or None)
        if not allow_mixed:
            plots.check_comparable(runs)
        fig = plots.eval_figure(runs)
    except (plots.PlotInputError, EvalFileError) as exc:
        raise click.ClickException(str(exc)) from exc
    for run in runs:
        if run.partial:
            click.echo(f"note: {run.path} holds a partial evaluation", err=True)
    click.echo(f"wrote {plots.save_figure(fig, output)}")


@plot.command("run", short_help="Training metrics over steps, one panel per metric.")
@click.argument("run", type=click.Path(exists=True, path_type=Path), metavar="RUN_DIR_OR_METRICS")
@click.option(
    "--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path), help="PNG to write."
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help=f"Metric to plot, repeatable [default: {', '.join(plots.DEFAULT_RUN_METRICS)}].",
)
def plot_run(run: Path, output: Path, metrics: tuple[str, ...]) -> None:
    """One panel per metric over steps, from a run directory's metrics.jsonl (or the file
    itself). Metrics the run never logged are skipped with a note."""
    try:
        path = plots.resolve_metrics_path(run)
        rows = plots.load_run_metrics(path)
        fig, skipped = plots.run_figure(rows, metrics or plots.DEFAULT_RUN_METRICS, title=str(path))
    except plots.PlotInputError as exc:
        raise click.ClickException(str(exc)) from exc
    for metric in skipped:
        click.echo(f"note: {metric} not logged in {path}; skipped", err=True)
    click.echo(f"wrote {plots.save_figure(fig, output)}")

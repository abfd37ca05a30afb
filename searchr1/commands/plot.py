"""``plot eval`` and ``plot run``: PNG figures from eval summaries and training metrics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedGroup
from searchr1.view import plots
from searchr1.evaluation.metrics import EvalFileError
from searchr1.basics.fileio import check_writable, is_write_failure, write_failure_line

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _png(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    if value.suffix.lower() != ".png":
        raise click.BadParameter(f"{value} does not end in .png; the figure is written as PNG")
    check_writable(value, "figure", click.ClickException)  # before any file is read
    return value


def _save(fig: Figure, output: Path) -> Path:
    """Save the figure; a full, read-only or forbidden disk is one line naming the file."""
    try:
        return plots.save_figure(fig, output)
    except OSError as error:
        if not is_write_failure(error):
            raise
        raise click.ClickException(write_failure_line(error)) from None


def _non_empty(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    if any(not value.strip() for value in values):
        raise click.BadParameter("must not be empty")
    return values


OUTPUT = click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
                      callback=_png, help="PNG to write.")


@click.group("plot", cls=SectionedGroup)
def plot() -> None:
    """Draw PNG figures from eval results or a training run (matplotlib, Agg, no display)."""


@plot.command("eval", short_help="Several evals side by side: a score per benchmark, macro score and format rate.")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@OUTPUT
@click.option(
    "--label",
    "labels",
    multiple=True,
    callback=_non_empty,
    help="Checkpoint label, once per FILE in the same order [default: the checkpoint named by the config's "
    "model_path, else '<base model> (base)'].",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Plot files whose search backend/concurrency/timeout/model or eval-set sha256 differ (marked in the title).",
)
@click.option("--metric", type=click.Choice(["em", "f1", "cover_em", "judge"]), default="em", show_default=True,
              help="Which answer score to plot: exact match, token F1 or cover EM (every summary reports all "
                   "three), or the judge's verdicts (summaries of `eval --judge`).")
def plot_eval(files: tuple[Path, ...], output: Path, labels: tuple[str, ...], allow_mixed: bool, metric: str) -> None:
    """Several evaluations side by side (%(prog)s plot eval A B C -o evals.png): the score
    per benchmark and the macro score / format rate, one colour per eval JSONL FILE (one per
    checkpoint; each file's last summary record is used)."""
    try:
        runs = plots.load_eval_runs(files, labels or None)
        if not allow_mixed:
            plots.check_comparable(runs)
        fig = plots.eval_figure(runs, metric)
    except (plots.PlotInputError, EvalFileError) as exc:
        raise click.ClickException(str(exc)) from exc
    for run in runs:
        if run.partial:
            click.echo(f"note: {run.path} holds a partial evaluation", err=True)
    click.echo(f"wrote {_save(fig, output)}")


@plot.command("run", short_help="Training metrics over steps, one panel per metric.")
@click.argument("run", type=click.Path(exists=True, path_type=Path), metavar="RUN_DIR_OR_METRICS")
@OUTPUT
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    callback=_non_empty,
    help=f"Metric to plot, repeatable [default: {', '.join(plots.DEFAULT_RUN_METRICS)}].",
)
@click.option(
    "--smooth",
    type=click.IntRange(min=0),
    default=None,
    metavar="STEPS",
    help="Average the line over this many steps either side (0: no line through averages) "
    "[default: about a tenth of the run, none under 5 steps].",
)
@click.option("--health", is_flag=True,
              help=f"The health panel instead: {', '.join(plots.HEALTH_RUN_METRICS)} (unless --metric is given).")
def plot_run(run: Path, output: Path, metrics: tuple[str, ...], smooth: int | None, health: bool) -> None:
    """One panel per metric over steps, from a run directory's metrics.jsonl (or the file
    itself): each step as a dot, a centred moving average as the line, rates on a fixed 0-1
    axis, unhealthy steps (the collapse guard's) as red vertical lines; the run's name and
    settings (from config.json) in the title. Metrics the run never logged are skipped with
    a note."""
    default: tuple[str, ...] = plots.HEALTH_RUN_METRICS if health else plots.DEFAULT_RUN_METRICS
    try:
        path = plots.resolve_metrics_path(run)
        rows = plots.load_run_metrics(path)
        title = plots.run_title(plots.load_run_config(path), str(path))
        if not health:
            default = plots.default_run_metrics(rows)
        fig, skipped = plots.run_figure(rows, metrics or default, title=title, half_width=smooth,
                                        leave_out_constant=not metrics)
    except plots.PlotInputError as exc:
        raise click.ClickException(str(exc)) from exc
    for metric in skipped:
        click.echo(f"note: {metric} not logged in {path}; skipped", err=True)
    drawn = {ax.get_title() for ax in fig.axes}
    if not metrics:
        for metric, value in plots.constant_metrics(rows, default).items():
            if plots.metric_title(metric) not in drawn:
                click.echo(f"note: {metric} is {value:g} at every step; left out (ask for it with --metric)",
                           err=True)
    click.echo(f"wrote {_save(fig, output)}")

"""``compare EVAL_A EVAL_B``: is B really better than A on the same questions?
Paired 95% intervals of the EM, F1 and cover-EM differences per source and macro (wide, never a
point, at a handful of questions), exact McNemar tests, the flipped questions, a plot
(:mod:`searchr1.evaluation.compare`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedCommand


@click.command("compare", cls=SectionedCommand)
@click.argument("eval_a", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="EVAL_A")
@click.argument("eval_b", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="EVAL_B")
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as one JSON object.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the differences with their intervals into this PNG.")
def compare(eval_a: Path, eval_b: Path, as_json: bool, plot_path: Path | None) -> None:
    """Compare two evaluations question by question (differences are B - A).

    Only questions both files answered count. Refused (exit 2) when the files used another
    question set, protocol, search backend, top-k, decoding, or differ in any card field that
    changes the numbers. Sources with too few paired questions to read alone are marked with *.

    \b
    %(prog)s compare eval_result/base.jsonl eval_result/step20.jsonl --plot cmp.png
    %(prog)s compare A.jsonl B.jsonl --json | jq .macro.em.difference
    """
    from searchr1.evaluation.compare import IncomparableEvals, compare_evals, format_comparison, load_eval
    from searchr1.evaluation.metrics import EvalFileError
    from searchr1.basics.fileio import check_writable

    if plot_path is not None:
        if plot_path.suffix.lower() != ".png":
            raise click.BadParameter(f"{plot_path} does not end in .png", param_hint="--plot")
        check_writable(plot_path, "figure", click.ClickException)
    try:
        a, b = load_eval(eval_a), load_eval(eval_b)
    except EvalFileError as error:
        raise click.ClickException(str(error)) from None
    try:
        result = compare_evals(a, b)
    except IncomparableEvals as error:
        click.echo(f"Error: {eval_a} and {eval_b} are not comparable: {error}", err=True)
        sys.exit(2)
    except EvalFileError as error:
        raise click.ClickException(str(error)) from None
    if plot_path is not None:
        from searchr1.commands.plot import _save
        from searchr1.view.plots import comparison_figure

        written = _save(comparison_figure(result), plot_path)
        click.echo(f"wrote {written}", err=True)
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False, allow_nan=False))
    else:
        click.echo(format_comparison(result))

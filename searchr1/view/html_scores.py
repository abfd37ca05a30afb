"""The score summary at the top of an eval's HTML page: macro and micro of every answer score
with its 95% interval, then one row per source with its question count, sources with fewer than
FEW_QUESTIONS questions marked ``*`` and footnoted, as ``eval`` prints them.

Built from the metrics of :func:`searchr1.evaluation.metrics.evaluation_metrics` (plain numbers);
every name that reaches the page (a source is read from the file) is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from searchr1.evaluation.intervals import FEW_QUESTIONS, few_questions
from searchr1.view.terminal import printable

SCORE_LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover EM", "judge": "judge"}
FEW_MARK = "*"


def _e(text: object) -> str:
    return html.escape(printable(text), quote=True)


def _cell(metrics: Mapping[str, float], value: str, low: str, high: str) -> str:
    if not all(key in metrics for key in (value, low, high)):
        return "<td>-</td>"
    return f'<td>{metrics[value]:.3f} <span class="ci">[{metrics[low]:.3f}, {metrics[high]:.3f}]</span></td>'


def _row(name: str, count: str, cells: Sequence[str], format_rate: str, *, few: bool = False) -> str:
    marked = ' class="few"' if few else ""
    return f'<tr{marked}><th scope="row">{name}</th><td>{count}</td>{"".join(cells)}<td>{format_rate}</td></tr>'


def scores_section(metrics: Mapping[str, float], *, caption: str) -> str:
    """A ``<section id="scores">`` holding the table: macro, micro, then each source."""
    names = [name for name in SCORE_LABELS if f"{name}/macro" in metrics]
    sources = sorted(key.split("/", 1)[1] for key in metrics if key.startswith("questions/"))
    rows = [
        _row("macro", str(int(metrics.get("eval/questions", 0))),
             [_cell(metrics, f"{n}/macro", f"{n}/macro_ci95_low", f"{n}/macro_ci95_high") for n in names],
             f"{metrics['format/rate']:.3f}" if "format/rate" in metrics else "-"),
        _row("micro", "", [_cell(metrics, f"{n}/micro", f"{n}/micro_ci95_low", f"{n}/micro_ci95_high")
                           for n in names], ""),
    ]
    few = [source for source in sources if few_questions(int(metrics[f"questions/{source}"]))]
    for source in sources:
        cells = [_cell(metrics, f"{n}/{source}", f"{n}_ci95_low/{source}", f"{n}_ci95_high/{source}") for n in names]
        rate = metrics.get(f"format/{source}")
        rows.append(_row(_e(source) + (FEW_MARK if source in few else ""), str(int(metrics[f"questions/{source}"])),
                         cells, "-" if rate is None else f"{rate:.3f}", few=source in few))
    head = "".join(f'<th>{SCORE_LABELS[n]} <span class="ci">[95% CI]</span></th>' for n in names)
    footnote = (f'<p class="note">{FEW_MARK} fewer than {FEW_QUESTIONS} questions: a wide interval, and one '
                f"question moves the score by {1 / FEW_QUESTIONS:.1f} or more; read it with care.</p>" if few else "")
    return "\n".join([
        '<section id="scores" class="scores">',
        f'<h2>Scores</h2><p class="note">{_e(caption)}</p>',
        f"<table><thead><tr><th>source</th><th>n</th>{head}<th>format</th></tr></thead>",
        "<tbody>", *rows, "</tbody></table>",
        footnote,
        "</section>",
    ])

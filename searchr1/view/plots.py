"""Figures from eval summaries and from a training run's metrics.

Everything is data-driven: which checkpoint is best, the annotations and the range of every
unbounded axis come from the files (the lab port hard-coded a "best" index, y-ranges and a footer
claim); only bounded metrics (rates, the mean reward) sit on their fixed range, so curves
compare at a glance. Offline (scripted) results say so in the title. Figures
are built with ``matplotlib.figure.Figure`` directly (no pyplot state, no GUI backend; the Agg
canvas renders the PNG) and returned unsaved, so tests can count panels before saving.
Sizes are fixed in inches at a fixed dpi, so a PNG's pixel size is known in advance.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.core.errors import UserError
from searchr1.data.dataset import EVAL_SOURCES
from searchr1.evaluation.card import table
from searchr1.evaluation.compare import JUDGE_SCORE, SCORES, Comparison, Difference, SourceComparison
from searchr1.evaluation.intervals import FEW_QUESTIONS, few_questions
from searchr1.evaluation.numbers import float_of
from searchr1.evaluation.metrics import COMPARABLE_CONFIG_FIELDS, is_finite_number, load_summary_with_current_intervals
from searchr1.basics.fileio import replacing
from searchr1.basics.json_types import JsonObject, as_object
from searchr1.basics.jsonl import Surrogates, iter_json_lines, read_json_document
from searchr1.basics.wording import plural
from searchr1.basics import invocation

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
EVAL_FIGSIZE = (11.0, 9.0)  # inches -> 1100 x 900 px at DPI
RUN_FIGSIZE = (12.0, 8.0)  # inches -> 1200 x 800 px at DPI
DEFAULT_RUN_METRICS = (
    "reward/mean",
    "reward/correct",
    "reward/format",
    "search/success_rate",
    "rollout/search_calls",
    "rollout/degenerate_group_rate",
    "trainer/loss_mean",
    "time/step_seconds",
)
# Running totals (searchr1.run.usage, searchr1.run.costs): drawn as they are, never averaged;
# by default when the run logged them (runs written before they were counted did not).
CUMULATIVE_PREFIXES = ("usage/total_", "cost/total")
CUMULATIVE_RUN_METRICS = ("usage/total_model_tokens", "cost/total")
# `plot run --health`: the collapse guard's diagnostics (searchr1.health.diagnostics, searchr1.health.rules)
HEALTH_RUN_METRICS = (
    "health/entropy",
    "health/mismatch_k3",
    "health/ratio_max_deviation",
    "health/repeated_turn_share",
    "health/action_tokens_mean",
    "health/action_tokens_p95",
    "reward/format",
    "rollout/termination/answer",
    "rollout/termination/no_answer",
)
UNHEALTHY_COLOR = "tab:red"
RATE_REWARDS = ("reward/correct", "reward/format")  # shares of trajectories, not mean rewards
# What a reader sees for the metrics a run logs: a panel title and the y axis' label. Others
# keep their key as the title.
METRIC_LABELS = {
    "reward/mean": ("Mean reward", "reward (-0.1 to 1)"),
    "reward/correct": ("Correct answers", "share of trajectories"),
    "reward/format": ("Well-formed answers", "share of trajectories"),
    "search/success_rate": ("Searches that succeeded", "share of searches"),
    "rollout/search_calls": ("Searches per trajectory", "searches"),
    "rollout/degenerate_group_rate": ("Groups with equal rewards", "share of groups"),
    "trainer/loss_mean": ("Training loss", "loss"),
    "time/step_seconds": ("Time per step", "seconds"),
    "health/entropy": ("Sampler entropy (estimate)", "nats per token"),
    "health/mismatch_k3": ("Sampler-learner mismatch (k3)", "k3"),
    "health/ratio_max_deviation": ("Largest importance-ratio deviation", "max |ratio - 1|"),
    "health/repeated_turn_share": ("Turns repeating an earlier turn", "share of turns"),
    "health/action_tokens_mean": ("Sampled tokens per trajectory", "tokens (mean)"),
    "health/action_tokens_p95": ("Sampled tokens per trajectory, p95", "tokens"),
    "rollout/termination/answer": ("Trajectories that answered", "share of trajectories"),
    "usage/total_model_tokens": ("Model tokens used so far", "tokens (sampled, trained, KL; cumulative)"),
    "cost/total": ("Spent so far", "cost in the price table's currency (cumulative)"),
    "rollout/termination/no_answer": ("Replies without an answer", "share of trajectories"),
}
RUN_METRICS_FILE = "metrics.jsonl"
RUN_CONFIG_FILE = "config.json"


class PlotInputError(UserError, ValueError):
    """Input files that cannot be plotted (or not together); the message names the files."""


# --- eval summaries -------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalRun:
    path: Path
    label: str
    summary: JsonObject

    @property
    def metrics(self) -> Mapping[str, object]:
        return as_object(self.summary["metrics"], "metrics")

    @property
    def partial(self) -> bool:
        return bool(self.summary.get("partial", False))

    def config_value(self, field: str) -> object:
        """A config field; lab-port-format summaries keep these at the top level instead."""
        config = self.summary.get("config")
        if isinstance(config, Mapping):
            return config.get(field)
        return self.summary.get(field)

    @property
    def offline(self) -> bool:
        """Produced by the offline twin (a small offline policy, cassette search), not a model."""
        return bool(self.config_value("offline")) or str(self.config_value("sampling_backend")).startswith("offline-")

    @property
    def offline_policy(self) -> str:
        backend = str(self.config_value("sampling_backend") or "")
        return backend.removeprefix("offline-") if backend.startswith("offline-") else "scripted"

    @property
    def display_label(self) -> str:
        if not self.partial:
            return self.label
        return f"{self.label} (partial, n={self.summary.get('evaluated_examples', '?')})"


def _policy_label(policy: object) -> str:
    """The twin's name for an offline policy (the twin package, and pytrio with it, loads only
    when an offline result is labelled); a config's value is named as written."""
    from searchr1.twin.policies import offline_policy_label

    return offline_policy_label(str(policy) if policy else None)


def default_label(path: Path, summary: Mapping[str, object]) -> str:
    """What was evaluated, by name: the checkpoint named by the config's model_path (the last
    segment of a sampler-weights URI, without ``-weights``: ``<run-name>-...-step-000050``),
    else the base model (``Qwen3.5-4B (base)``), else the file stem. Offline evaluations name
    the twin's policy instead of the model (``twin learning policy (base)``), and after a
    checkpoint's name."""
    stored = summary.get("config")
    config = stored if isinstance(stored, Mapping) else summary
    backend = str(config.get("sampling_backend") or "")
    offline = bool(config.get("offline")) or backend.startswith("offline-")
    policy = _policy_label(backend.removeprefix("offline-") if backend.startswith("offline-") else None)
    model_path = config.get("model_path")
    if isinstance(model_path, str) and model_path.strip("/ "):
        name = model_path.rstrip("/").rsplit("/", 1)[-1]
        name = name.removesuffix("-weights") or name
        return f"{name} ({policy})" if offline else name
    if offline:  # the twin's policy, not the model a live run would sample
        return f"{policy} (base)"
    base_model = config.get("base_model")
    if isinstance(base_model, str) and base_model.strip("/ "):
        return f"{base_model.rstrip('/').rsplit('/', 1)[-1]} (base)"
    return path.stem


def load_eval_runs(
    paths: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None
) -> list[EvalRun]:
    """Read the last summary of each eval file, its intervals recomputed from the file's records
    by today's rules (an older file's percentile bootstrap is a point at one or two questions a
    source), and label it; labels that would repeat fall back to the file stem so every
    checkpoint stays distinguishable."""
    if not paths:
        raise PlotInputError("no eval files given")
    if labels and len(labels) != len(paths):
        raise PlotInputError(
            f"got {len(labels)} --label values for {len(paths)} eval files; give one per file or none"
        )
    runs: list[EvalRun] = []
    for index, raw in enumerate(paths):
        path = Path(raw)
        summary = load_summary_with_current_intervals(path)
        label = labels[index] if labels else default_label(path, summary)
        runs.append(EvalRun(path, label, summary))
    if not labels:
        counts = {r.label: sum(o.label == r.label for o in runs) for r in runs}
        runs = [EvalRun(r.path, r.path.stem if counts[r.label] > 1 else r.label, r.summary) for r in runs]
    return runs


def config_differences(
    runs: Sequence[EvalRun], fields: Sequence[str] = COMPARABLE_CONFIG_FIELDS
) -> dict[str, dict[str, object]]:
    """``{field: {file: value}}`` for every field whose value is not the same in all runs."""
    differing: dict[str, dict[str, object]] = {}
    for field in fields:
        values = {str(r.path): r.config_value(field) for r in runs}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            differing[field] = values
    return differing


def check_comparable(runs: Sequence[EvalRun]) -> None:
    """Refuse to put evaluations with different search setups or eval sets on one chart: their
    EM differences would measure the environment, not the checkpoint."""
    differing = config_differences(runs)
    if differing:
        lines = [
            f"  {field}: " + ", ".join(f"{path}={value!r}" for path, value in values.items())
            for field, values in differing.items()
        ]
        raise PlotInputError(
            "eval files are not comparable (pass --allow-mixed to plot them anyway):\n" + "\n".join(lines)
        )


def eval_sources(runs: Sequence[EvalRun]) -> list[str]:
    """Sources present in any run: the seven benchmarks in release order, then others sorted."""
    found = {key.split("/", 1)[1] for run in runs for key in run.metrics if key.startswith("questions/")}
    if not found:  # lab-port-format summaries: em/<source> without question counts
        reserved = {"macro", "micro"}
        found = {
            key.split("/", 1)[1]
            for run in runs
            for key in run.metrics
            if key.startswith("em/") and "_ci95_" not in key and key.split("/", 1)[1] not in reserved
        }
    return [s for s in EVAL_SOURCES if s in found] + sorted(found - set(EVAL_SOURCES))


def _number(metrics: Mapping[str, object], key: str) -> float:
    value = metrics.get(key)
    return float(value) if is_finite_number(value) else math.nan


def _error(point: float, low: float, high: float) -> tuple[float, float]:
    if math.isnan(point) or math.isnan(low) or math.isnan(high):
        return (0.0, 0.0)
    return (max(point - low, 0.0), max(high - point, 0.0))


def _y_top(values: Sequence[float], *, upright_labels: bool = False) -> float:
    """Upper y limit from the data: 20% headroom for the value labels, at most 12 points (20
    for labels written upright, which stand taller)."""
    finite = [v for v in values if not math.isnan(v)]
    top = max(finite, default=0.0)
    return min(top * 1.2, top + (20 if upright_labels else 12)) if top > 0 else 1.0


def _labels(values: Sequence[float]) -> list[str]:
    return ["" if math.isnan(v) else f"{v:.1f}" for v in values]


def questions_per_source(runs: Sequence[EvalRun], source: str) -> list[int]:
    """The distinct question counts of ``source`` across the runs (sorted; runs that did not
    record one are left out)."""
    key = f"questions/{source}"
    counts = {int(value) for r in runs if is_finite_number(value := r.metrics.get(key))}
    return sorted(counts)


def source_tick_label(runs: Sequence[EvalRun], source: str) -> str:
    """``nq`` over ``n=50`` (``n=50/20`` when the runs evaluated different numbers), each count
    under FEW_QUESTIONS marked ``*`` as the tables mark it."""
    counts = questions_per_source(runs, source)
    return f"{source}\nn={'/'.join(f'{n}*' if few_questions(n) else str(n) for n in counts)}" if counts else source


OFFLINE_NOTES = {
    "scripted": "OFFLINE: scripted policy and cassette search; these numbers test the plumbing, not a model",
    "learning": "OFFLINE: the twin's small learning policy and cassette search, not a language model",
}


def offline_note(policy: str) -> str:
    return OFFLINE_NOTES.get(policy, f"OFFLINE: the twin's {policy} policy and cassette search, not a language model")


def eval_title(runs: Sequence[EvalRun]) -> str:
    parts = [f"{len(runs)} evaluation{'s' if len(runs) != 1 else ''}"]
    backends = {str(r.config_value("search_backend")) for r in runs if r.config_value("search_backend")}
    if backends:
        parts.append("search: " + "/".join(sorted(backends)))
    shas = {str(r.config_value("dataset_sha256"))[:10] for r in runs if r.config_value("dataset_sha256")}
    if shas:
        parts.append("eval set " + "/".join(sorted(shas)))
    sizes = sorted({str(r.summary.get("evaluated_examples", "?")) for r in runs})
    parts.append("questions " + "/".join(sizes))
    lines = [" | ".join(parts)]
    offline = [r for r in runs if r.offline]
    if len(offline) == len(runs):
        policies = sorted({r.offline_policy for r in offline})
        lines.insert(0, offline_note(policies[0]) if len(policies) == 1 else offline_note("/".join(policies)))
    elif offline:
        lines.insert(0, "MIXED: runs marked (offline) used an offline twin policy and cassette search")
    if any(r.partial for r in runs):
        lines.append("includes PARTIAL evaluations (marked in the legend)")
    if len(config_differences(runs)) > 0:
        lines.append("MIXED search config or eval set (--allow-mixed)")
    return "\n".join(lines)


def _run_label(run: EvalRun, runs: Sequence[EvalRun]) -> str:
    """The legend/tick label; offline runs are marked when live ones share the figure."""
    mixed = any(r.offline for r in runs) and not all(r.offline for r in runs)
    return f"{run.display_label} (offline)" if mixed and run.offline else run.display_label


def _value_label_size(runs: int) -> float:
    """Smaller labels when more bars share a benchmark, so neighbours do not overlap."""
    return 8.0 if runs <= 2 else 7.0 if runs <= 4 else 6.0


def _label_fits_across(bar_width_data: float, groups: int, fontsize: float) -> bool:
    """Whether a value label such as ``100.0`` fits across one bar written horizontally: the
    bar's width in pixels (the panel is about 85% of the figure wide, ``groups`` benchmarks
    side by side) against five characters at ``fontsize`` (about 0.6 em each)."""
    panel_px = 0.85 * EVAL_FIGSIZE[0] * DPI
    bar_px = panel_px * bar_width_data / max(groups, 1)
    label_px = 5 * 0.6 * fontsize * DPI / 72
    return 1.15 * label_px <= bar_px  # and a little room between neighbours


def run_colours(count: int) -> list[str]:
    """One colour per evaluated checkpoint, the same in both panels (matplotlib's cycle)."""
    cycle = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
             "tab:olive", "tab:cyan", "tab:gray"]
    return [cycle[i % len(cycle)] for i in range(count)]


EVAL_METRICS = {"em": ("EM", "exact match (%)"), "f1": ("F1", "token F1 (%)"),
                "cover_em": ("cover EM", "cover exact match (%)"), "judge": ("judge", "judged correct (%)")}


def _figure(size: tuple[float, float]) -> Figure:
    """A figure drawn by Agg, with no pyplot state. matplotlib is imported here, when a figure is
    drawn, so that the commands that draw none start without it (about a second)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _integer_ticks() -> object:
    """Axis ticks at whole numbers only (steps)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def eval_figure(runs: Sequence[EvalRun], metric: str = "em") -> Figure:
    """Two panels: ``metric`` (em, f1 or cover_em) per benchmark grouped by checkpoint, and, per
    checkpoint, its macro value and the format rate side by side, each checkpoint in the same
    colour in both panels. Error bars are the 95% intervals (:mod:`searchr1.evaluation.intervals`:
    never a point at one or two questions); every value is written above its upper whisker
    (upright when the bars are too narrow); each benchmark's tick says how many questions it had,
    ``*`` marking fewer than FEW_QUESTIONS."""
    _check_eval_metric(runs, metric)
    fig = _figure(EVAL_FIGSIZE)
    top, bottom = fig.subplots(2, 1)
    colours = run_colours(len(runs))
    _draw_per_benchmark(top, runs, metric, colours)
    _draw_macro_and_format(bottom, runs, metric, colours)
    fig.suptitle(eval_title(runs), fontsize=10)
    fig.tight_layout()
    return fig


def _check_eval_metric(runs: Sequence[EvalRun], metric: str) -> None:
    """Refuse no evaluations, an unknown metric, or one that a summary does not hold."""
    if not runs:
        raise PlotInputError("no evaluations to plot")
    if metric not in EVAL_METRICS:
        raise PlotInputError(f"unknown metric {metric!r}; choose one of {', '.join(EVAL_METRICS)}")
    for run in runs:
        if metric == "judge" and "judge/macro" not in run.metrics:
            raise PlotInputError(f"{run.path}: its summary has no judge metrics (evaluate it with --judge); "
                                 "plot it with --metric em")
        if metric != "em" and f"{metric}/macro" not in run.metrics:
            raise PlotInputError(f"{run.path}: its summary has no {metric} (it was written before F1 and "
                                 "cover EM were reported); plot it with --metric em")


def _draw_per_benchmark(top: Axes, runs: Sequence[EvalRun], metric: str, colours: list[str]) -> None:
    """The upper panel: ``metric`` per benchmark, one bar per checkpoint, with its interval and value
    (a bar of height 0 marked on the axis; partial evaluations hatched)."""
    label, axis = EVAL_METRICS[metric]
    sources = eval_sources(runs)
    label_size = _value_label_size(len(runs))
    width = 0.8 / len(runs)
    across = _label_fits_across(width, len(sources), label_size)
    heights_seen: list[float] = []
    for i, run in enumerate(runs):
        points = [100 * _number(run.metrics, f"{metric}/{s}") for s in sources]
        lows = [100 * _number(run.metrics, f"{metric}_ci95_low/{s}") for s in sources]
        highs = [100 * _number(run.metrics, f"{metric}_ci95_high/{s}") for s in sources]
        errors = [_error(p, lo, hi) for p, lo, hi in zip(points, lows, highs)]
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(sources))]
        top.bar(
            xs,
            points,
            width,
            label=_run_label(run, runs),
            color=colours[i],
            yerr=[[e[0] for e in errors], [e[1] for e in errors]],
            capsize=2,
            error_kw={"elinewidth": 0.8},
            hatch="//" if run.partial else None,
        )
        zero = [x for x, point in zip(xs, points) if point == 0]
        if zero:  # a bar of height 0 is invisible: a thick stroke in its colour marks it on the axis
            top.hlines([0.0] * len(zero), [x - 0.42 * width for x in zero], [x + 0.42 * width for x in zero],
                       colors=colours[i], linewidth=3, zorder=3, clip_on=False)
        for x, point, error, text in zip(xs, points, errors, _labels(points)):
            if text:  # just above the upper whisker; upright when bars are too narrow for it
                top.annotate(text, (x, point + error[1]), textcoords="offset points", xytext=(0, 2),
                             ha="center", va="bottom", fontsize=label_size, rotation=0 if across else 90)
        heights_seen += [p + e[1] for p, e in zip(points, errors)]
    top.set_xticks(range(len(sources)), [source_tick_label(runs, s) for s in sources], fontsize=9)
    top.set_ylabel(axis)
    few = any(few_questions(n) for s in sources for n in questions_per_source(runs, s))
    top.set_title(f"{label} per benchmark (95% CI; n = questions"
                  + (f", * fewer than {FEW_QUESTIONS})" if few else ")"), fontsize=10)
    top.set_ylim(0, _y_top(heights_seen, upright_labels=not across))
    top.legend(fontsize=8, ncols=min(len(runs), 4), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def _draw_macro_and_format(bottom: Axes, runs: Sequence[EvalRun], metric: str, colours: list[str]) -> None:
    """The lower panel: two bars per checkpoint in its colour from the panel above, the macro value
    solid with its interval and the format rate outlined, every value above its own bar."""
    label = EVAL_METRICS[metric][0]
    xs = list(range(len(runs)))
    macro = [100 * _number(r.metrics, f"{metric}/macro") for r in runs]
    macro_err = [
        _error(m, 100 * _number(r.metrics, f"{metric}/macro_ci95_low"),
               100 * _number(r.metrics, f"{metric}/macro_ci95_high"))
        for m, r in zip(macro, runs)
    ]
    fmt = [100 * _number(r.metrics, "format/rate") for r in runs]
    # Two bars per checkpoint, in the checkpoint's colour from the panel above: the macro value solid,
    # format rate outlined; every value above its own bar, so no two labels share a place.
    pair = 0.36
    macro_xs = [x - pair / 2 for x in xs]
    format_xs = [x + pair / 2 for x in xs]
    bottom.bar(macro_xs, macro, pair, color=colours, gid="macro",
               yerr=[[e[0] for e in macro_err], [e[1] for e in macro_err]], capsize=3)
    bottom.bar(format_xs, fmt, pair, color="white", edgecolor=colours, linewidth=1.5, hatch="..",
               gid="format rate")
    for x, height, text in zip([*macro_xs, *format_xs], [m + e[1] for m, e in zip(macro, macro_err)] + fmt,
                               _labels(macro) + _labels(fmt)):
        if text:
            bottom.annotate(text, (x, height), textcoords="offset points", xytext=(0, 2), ha="center",
                            va="bottom", fontsize=8)
    for x, value, colour in zip([*macro_xs, *format_xs], macro + fmt, colours + colours):
        if value == 0:  # as above: a bar of height 0 still shows
            bottom.hlines([0.0], [x - 0.42 * pair], [x + 0.42 * pair], colors=colour, linewidth=3, zorder=3,
                          clip_on=False)
    bottom_top = _y_top([m + e[1] for m, e in zip(macro, macro_err)] + fmt)
    from matplotlib.patches import Patch

    bottom.legend(handles=[Patch(facecolor="dimgray", label=f"macro {label} (95% CI)"),
                           Patch(facecolor="white", edgecolor="dimgray", hatch="..", label="format rate")],
                  fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    long_labels = len(runs) > 4 or max(len(_run_label(r, runs)) for r in runs) * len(runs) > 90
    bottom.set_xticks(xs, [_run_label(r, runs) for r in runs], rotation=15 if long_labels else 0,
                      ha="right" if long_labels else "center", fontsize=8)
    bottom.set_xlim(-0.75, len(runs) - 0.25)
    bottom.set_ylabel("%")
    bottom.set_title(f"Macro {label} and format rate per checkpoint (colours as above)", fontsize=10)
    bottom.set_ylim(0, bottom_top)


COMPARE_FIGSIZE = (11.0, 6.0)  # inches -> 1100 x 600 px at DPI


def comparison_figure(result: Comparison) -> Figure:
    """One panel: the paired differences ``B - A`` (percentage points) of every score in a
    ``compare`` result, per source and macro, with their paired 95% intervals and a zero line;
    each group's tick says how many paired questions it had (``*``: fewer than FEW_QUESTIONS)."""
    names = [n for n in (*SCORES, JUDGE_SCORE) if n in result["macro"]]
    labels = {"em": "EM", "f1": "F1", "cover_em": "cover EM", "judge": "judge"}
    groups: list[tuple[str, SourceComparison | dict[str, Difference]]] = [
        (f"{s}\nn={e['n']}{'*' if few_questions(int(e['n'])) else ''}", e) for s, e in result["sources"].items()]
    groups.append((f"macro\nn={result['paired_questions']}", result["macro"]))
    fig = _figure(COMPARE_FIGSIZE)
    ax = fig.subplots()
    colours = run_colours(len(names))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(groups))]
        points = [100 * g[name]["difference"] for _, g in groups]
        errors = [_error(p, 100 * g[name]["ci95_low"], 100 * g[name]["ci95_high"]) for p, (_, g) in zip(points, groups)]
        ax.bar(xs, points, width, color=colours[i], label=labels[name],
               yerr=[[e[0] for e in errors], [e[1] for e in errors]], capsize=2, error_kw={"elinewidth": 0.8})
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [g for g, _ in groups], fontsize=9)
    ax.set_ylabel("B - A (percentage points)")
    ax.set_title(f"B - A on the paired questions (paired 95% CI; * fewer than {FEW_QUESTIONS})\n"
                 f"A: {result['model_a']}   B: {result['model_b']}", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


# --- training-run metrics -----------------------------------------------------------------


def resolve_metrics_path(run_dir_or_file: str | os.PathLike[str]) -> Path:
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / RUN_METRICS_FILE
    if not path.is_file():
        raise PlotInputError(f"{path}: no such metrics file")
    return path


def load_run_metrics(path: str | os.PathLike[str]) -> list[JsonObject]:
    """Rows of a run's metrics.jsonl, one per step, sorted by step. A step logged twice (a
    resumed run repeats steps) keeps its last row. Bad lines raise with ``path:line``."""
    by_step: dict[float, JsonObject] = {}
    for number, row in iter_json_lines(path, error=PlotInputError):
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(row, dict) or not is_finite_number(step):
            raise PlotInputError(f"{path}:{number}: expected a JSON object with a numeric 'step'")
        by_step[step] = row
    return [by_step[s] for s in sorted(by_step)]


def load_run_config(metrics_path: str | os.PathLike[str]) -> JsonObject | None:
    """The run's config.json beside its metrics file, or None when there is none."""
    path = Path(metrics_path).with_name(RUN_CONFIG_FILE)
    if not path.is_file():
        return None
    config = read_json_document(path, error=PlotInputError, surrogates=Surrogates.MEND)
    if not isinstance(config, dict):
        raise PlotInputError(f"{path}: expected a JSON object")
    return config


def run_title(config: Mapping[str, object] | None, fallback: str) -> str:
    """Run name and the settings that shape the curves; the offline twin is said out loud."""
    if not config:
        return fallback
    rollout, search = table(config, "rollout"), table(config, "search")
    parts = [str(config.get("run_name") or fallback)]
    if config.get("offline"):  # the twin's policy was trained, not the model
        parts.append(_policy_label(config.get("offline_policy")))
    elif config.get("base_model"):
        model = str(config["base_model"]).rsplit("/", 1)[-1]
        parts.append(f"{model} LoRA r{config['lora_rank']}" if config.get("lora_rank") else model)
    if search.get("backend"):
        parts.append(f"search {search['backend']}")
    if config.get("questions_per_batch") and rollout.get("group_size"):
        parts.append(f"{config['questions_per_batch']} questions x {rollout['group_size']} samples")
    if is_finite_number(config.get("learning_rate")):
        parts.append(f"lr {config['learning_rate']:g}")
    if config.get("advantage_mode"):
        parts.append(f"advantage {config['advantage_mode']}")
    title = " | ".join(parts)
    if config.get("offline"):
        policy = str(config.get("offline_policy") or "scripted")
        what = ("a small policy learning on the offline question set, not a language model" if policy == "learning"
                else f"{policy} policy: curves test the plumbing, not learning")
        title = f"OFFLINE twin ({what})\n" + title
    return title


def metric_title(metric: str) -> str:
    return METRIC_LABELS.get(metric, (metric, ""))[0]


def metric_axis_label(metric: str) -> str:
    """The y axis' label: the metric's unit (a share for rates, seconds for times)."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric][1]
    if metric_range(metric) == (0.0, 1.0):
        return "share"
    return "seconds" if metric.startswith("time/") else metric.rsplit("/", 1)[-1].replace("_", " ")


def constant_metrics(rows: Sequence[Mapping[str, object]], metrics: Sequence[str]) -> dict[str, float]:
    """``{metric: value}`` for the metrics logged at two steps or more with the same value at
    every step (``search/success_rate`` offline): a flat line says nothing a note cannot."""
    constant = {}
    for metric in metrics:
        values = run_series(rows, metric)[1]
        if len(values) >= 2 and all(v == values[0] for v in values):
            constant[metric] = values[0]
    return constant


def missing_steps(rows: Sequence[Mapping[str, object]], metric: str) -> list[float]:
    """Steps of the run (between its first and last) that logged no value for ``metric``."""
    logged = set(run_series(rows, metric)[0])
    return [_step(r) for r in rows if _step(r) not in logged]


def _step(row: Mapping[str, object]) -> float:
    """A metrics row's step (:func:`load_run_metrics` found it a number)."""
    return float_of(row["step"], "step")


def _segments(steps: Sequence[float], all_steps: Sequence[float]) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of ``steps`` that follow each other in ``all_steps``
    without a missing step between them."""
    position = {step: i for i, step in enumerate(all_steps)}
    segments, start = [], 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or position[steps[i]] != position[steps[i - 1]] + 1:
            segments.append((start, i))
            start = i
    return segments


def run_series(rows: Sequence[Mapping[str, object]], metric: str) -> tuple[list[float], list[float]]:
    """(steps, values) where the metric was logged as a finite number."""
    pairs = [(_step(r), float(value)) for r in rows if is_finite_number(value := r.get(metric))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def metric_range(metric: str) -> tuple[float, float] | None:
    """The fixed y range of a bounded metric (rates and shares 0-1, the mean reward -0.1-1),
    so that curves of different runs and steps compare at a glance; None when unbounded."""
    if metric == "reward/mean" or (metric.startswith("reward/") and metric not in RATE_REWARDS):
        return (-0.1, 1.0)
    name = metric.rsplit("/", 1)[-1]
    if (metric in RATE_REWARDS or name.endswith("_rate") or name.endswith("_share")
            or metric.startswith("rollout/termination/")):
        return (0.0, 1.0)
    return None


def unhealthy_steps(rows: Sequence[Mapping[str, object]]) -> list[float]:
    """Steps the collapse guard judged unhealthy (``health/unhealthy`` set in their line)."""
    return [_step(r) for r in rows if is_finite_number(r.get("health/unhealthy")) and r["health/unhealthy"]]


def smoothing_half_width(points: int) -> int:
    """Half the centred window used for the smoothed line: none under 5 points, then about a
    tenth of the run (1 for 5-29 points, 10 for 200)."""
    return 0 if points < 5 else max(1, round(points / 20))


def smooth(values: Sequence[float], half_width: int) -> list[float]:
    """Centred moving average: each value is the mean of the values at most ``half_width``
    positions away (fewer at the ends)."""
    if half_width < 0:
        raise ValueError(f"half_width must be >= 0, got {half_width}")
    means = []
    for i in range(len(values)):
        window = values[max(0, i - half_width): i + half_width + 1]
        means.append(sum(window) / len(window))
    return means


def default_run_metrics(rows: Sequence[Mapping[str, object]]) -> tuple[str, ...]:
    """The default panels, with the running totals the run logged (the cost when it was priced, ``--prices``)."""
    return DEFAULT_RUN_METRICS + tuple(m for m in CUMULATIVE_RUN_METRICS if any(m in row for row in rows))


def run_figure(
    rows: Sequence[Mapping[str, object]],
    metrics: Sequence[str] = DEFAULT_RUN_METRICS,
    *,
    title: str | None = None,
    half_width: int | None = None,
    leave_out_constant: bool = False,
) -> tuple[Figure, list[str]]:
    """One panel per requested metric that the run logged, over integer steps: each step as a
    faint dot, a centred moving average as the line (``half_width`` steps either side; by
    default :func:`smoothing_half_width`), bounded metrics on their fixed range, a readable
    title and the unit on the y axis, every panel over the same steps, and a red vertical line
    at every step the collapse guard judged unhealthy. Steps that logged no value are shaded and
    the line breaks there. With ``leave_out_constant``, metrics with one value at every step get
    a footnote instead of a panel. Returns the figure and the metrics skipped because they
    never appear (so the caller can say so)."""
    present = [m for m in metrics if run_series(rows, m)[0]]
    skipped = [m for m in metrics if m not in present]
    constant = constant_metrics(rows, present) if leave_out_constant else {}
    if constant and len(constant) < len(present):
        present = [m for m in present if m not in constant]
    else:
        constant = {}
    if not present:
        logged = sorted({k for r in rows for k in r if k != "step"})
        raise PlotInputError(
            f"none of the requested metrics ({', '.join(metrics)}) were logged; available: "
                             f"{', '.join(logged) or 'none'}"
        )
    fig = _figure(RUN_FIGSIZE)
    ncols = min(4, len(present))
    nrows = math.ceil(len(present) / ncols)
    grid = fig.subplots(nrows, ncols, squeeze=False)
    cells = [ax for row in grid for ax in row]
    windows = set()
    flagged = unhealthy_steps(rows)
    all_steps = [_step(r) for r in rows]
    gaps = False
    for ax, metric in zip(cells, present):
        steps, values = run_series(rows, metric)
        segments = _segments(steps, all_steps)
        width = smoothing_half_width(len(values)) if half_width is None else half_width
        if metric.startswith(CUMULATIVE_PREFIXES):
            width = 0  # a running total is its own summary
        if width:
            ax.plot(steps, values, linestyle="none", marker="o", markersize=2.5, alpha=0.35, color="tab:blue")
            for start, end in segments:  # the average never reaches across a missing step
                ax.plot(steps[start:end], smooth(values[start:end], width), color="tab:blue", linewidth=1.6)
            windows.add(2 * width + 1)
        else:
            xs, ys = [], []
            for start, end in segments:
                xs += [*steps[start:end], math.nan]
                ys += [*values[start:end], math.nan]
            ax.plot(xs[:-1], ys[:-1], marker="o", markersize=3, color="tab:blue")
        for step in missing_steps(rows, metric):
            ax.axvspan(step - 0.5, step + 0.5, color="0.88", zorder=0, linewidth=0)
            gaps = True
        bounds = metric_range(metric)
        if bounds is not None:
            margin = 0.05 * (bounds[1] - bounds[0])
            ax.set_ylim(bounds[0] - margin, bounds[1] + margin)
        for step in flagged:
            ax.axvline(step, color=UNHEALTHY_COLOR, alpha=0.35, linewidth=1.2)
        ax.set_xlim(min(all_steps) - 0.5, max(all_steps) + 0.5)
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.set_title(metric_title(metric), fontsize=9)
        ax.set_ylabel(metric_axis_label(metric), fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in cells[len(present) :]:
        fig.delaxes(ax)
    if title:
        fig.suptitle(title, fontsize=10)
    footer = []
    if windows:
        footer.append(f"dots: each step; line: centred mean over {'/'.join(map(str, sorted(windows)))} steps")
    if flagged:
        footer.append(f"red lines: {plural(len(flagged), 'unhealthy step')} "
                      f"({invocation.command('show RUN --step K')})")
    if gaps:
        footer.append("grey: steps that logged no value (a step with nothing to train logs no loss)")
    if constant:
        footer.append("the same at every step: " + ", ".join(f"{m} = {v:g}" for m, v in constant.items()))
    if skipped:
        footer.append("not logged: " + ", ".join(skipped))
    if footer:
        fig.text(0.01, 0.005, "   ".join(footer), fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig, skipped


def save_figure(fig: Figure, output: str | os.PathLike[str]) -> Path:
    """Render to PNG at the figure's own dpi (no tight bbox, so the pixel size is exactly
    figsize x dpi) through a temporary file and an atomic rename."""
    output = Path(output)
    with replacing(output) as temporary:
        fig.savefig(temporary, format="png", dpi=fig.dpi)
    return output

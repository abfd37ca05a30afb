"""Figures from eval summaries and run metrics, rendered from files written by the tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from searchr1.view import plots
from searchr1.cli import main
from searchr1.evaluation.metrics import load_summary, summary_record

BASE_CONFIG = {
    "search_backend": "wikipedia",
    "search_concurrency": 3,
    "search_timeout": 15.0,
    "search_model": None,
    "base_model": "Qwen/Qwen3.5-4B",
    "model_path": None,
    "dataset_path": "datasets/dev.jsonl",
    "dataset_sha256": "0" * 64,
}


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def trajectory(source: str, index: int, em: bool, fmt: bool = True) -> dict:
    return {
        "type": "trajectory",
        "id": f"{source}/{index}",
        "question": "q?",
        "answers": ["a"],
        "data_source": source,
        "turns": [],
        "searches": [],
        "final_text": "",
        "termination": "answer",
        "reward": 1.0 if em else 0.0,
        "exact_match": em,
        "valid_format": fmt,
        "search_calls": 0,
        "assistant_turns": 1,
        "env_error": False,
    }


def write_eval_file(
    path: Path, correct: dict[str, int], *, per_source: int = 10, partial: bool = False, **config
) -> Path:
    """An eval JSONL with ``correct[source]`` right answers out of ``per_source`` per source."""
    records = [trajectory(s, i, i < k) for s, k in correct.items() for i in range(per_source)]
    summary = summary_record(
        records, config={**BASE_CONFIG, **config}, search_metrics={"success_rate": 1.0}, partial=partial
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in [*records, summary]), encoding="utf-8")
    return path


CHECKPOINTS = {
    "base": {"nq": 3, "hotpotqa": 2, "bamboogle": 1},
    "step20": {"nq": 5, "hotpotqa": 4, "bamboogle": 2},
    "step50": {"nq": 4, "hotpotqa": 6, "bamboogle": 3},
}


@pytest.fixture
def eval_files(tmp_path: Path) -> list[Path]:
    return [
        write_eval_file(
            tmp_path / f"eval_{name}.jsonl",
            correct,
            model_path=None if name == "base" else f"trio://run/{name}-weights",
        )
        for name, correct in CHECKPOINTS.items()
    ]


# --- eval figure -------------------------------------------------------------------------------


def test_eval_figure_has_two_panels_and_renders_at_the_declared_size(eval_files, tmp_path):
    fig = plots.eval_figure(plots.load_eval_runs(eval_files))
    assert len(fig.axes) == 2
    out = plots.save_figure(fig, tmp_path / "figs" / "eval.png")
    assert png_size(out) == (1100, 900)
    assert not [p for p in out.parent.iterdir() if p.name != "eval.png"]  # no temp file left


def test_eval_figure_bars_follow_the_data(eval_files):
    fig = plots.eval_figure(plots.load_eval_runs(eval_files))
    top, bottom = fig.axes
    # release order, each with its number of questions
    assert [t.get_text() for t in top.get_xticklabels()] == ["nq\nn=10", "hotpotqa\nn=10", "bamboogle\nn=10"]
    per_source = [p.get_height() for p in top.patches]
    expected = [100 * k / 10 for correct in CHECKPOINTS.values() for k in correct.values()]
    assert per_source == pytest.approx(expected)
    macro = [p.get_height() for p in bottom.patches if p.get_gid() == "macro"]
    assert macro == pytest.approx([100 * sum(c.values()) / 30 for c in CHECKPOINTS.values()])
    # the axis adapts to the data: it clears the highest error bar with room for the labels
    highest = max(
        100 * load_summary(f)["metrics"][f"em_ci95_high/{s}"]
        for f in eval_files
        for s in ("nq", "hotpotqa", "bamboogle")
    )
    assert highest < top.get_ylim()[1] <= highest + 12
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["Qwen3.5-4B (base)", "step20", "step50"]


def test_eval_figure_y_axis_is_not_fixed(tmp_path):
    low = write_eval_file(tmp_path / "low.jsonl", {"nq": 1, "popqa": 1})
    high = write_eval_file(tmp_path / "high.jsonl", {"nq": 10, "popqa": 9})
    low_top = plots.eval_figure(plots.load_eval_runs([low])).axes[0].get_ylim()[1]
    high_top = plots.eval_figure(plots.load_eval_runs([high])).axes[0].get_ylim()[1]
    whisker = 100 * max(load_summary(low)["metrics"][f"em_ci95_high/{s}"] for s in ("nq", "popqa"))
    assert whisker < low_top <= whisker + 12 < 100
    assert high_top >= 100


def test_partial_evaluations_are_marked(tmp_path):
    full = write_eval_file(tmp_path / "full.jsonl", {"nq": 2})
    part = write_eval_file(tmp_path / "part.jsonl", {"nq": 2}, per_source=4, partial=True)
    fig = plots.eval_figure(plots.load_eval_runs([full, part], ["base", "step10"]))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["base", "step10 (partial, n=4)"]
    assert "PARTIAL" in fig._suptitle.get_text()


def test_labels_must_match_the_files(eval_files):
    with pytest.raises(plots.PlotInputError, match="2 --label values for 3 eval files"):
        plots.load_eval_runs(eval_files, ["a", "b"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("search_backend", "deepseek"),
        ("search_concurrency", 16),
        ("search_timeout", 60.0),
        ("search_model", "deepseek-v4-flash"),
        ("dataset_sha256", "f" * 64),
    ],
)
def test_mixed_configs_are_refused_naming_files_and_field(eval_files, tmp_path, field, value):
    odd = write_eval_file(tmp_path / "odd.jsonl", {"nq": 1}, **{field: value})
    runs = plots.load_eval_runs([*eval_files, odd])
    with pytest.raises(plots.PlotInputError) as info:
        plots.check_comparable(runs)
    message = str(info.value)
    assert field in message and str(odd) in message and str(eval_files[0]) in message
    assert "--allow-mixed" in message
    plots.check_comparable(runs[:-1])  # the others agree


def test_cli_plot_eval_refuses_mixed_unless_allowed(eval_files, tmp_path):
    odd = write_eval_file(tmp_path / "odd.jsonl", {"nq": 1}, search_backend="zhihu")
    out = tmp_path / "mixed.png"
    refused = CliRunner().invoke(
        main, ["plot", "eval", *map(str, eval_files), str(odd), "--output", str(out)]
    )
    assert refused.exit_code != 0
    assert "search_backend" in refused.output and "odd.jsonl" in refused.output
    assert not out.exists()

    allowed = CliRunner().invoke(
        main, ["plot", "eval", *map(str, eval_files), str(odd), "--output", str(out), "--allow-mixed"]
    )
    assert allowed.exit_code == 0, allowed.output
    assert png_size(out) == (1100, 900)


def test_cli_plot_eval_with_labels(eval_files, tmp_path):
    out = tmp_path / "labelled.png"
    args = [
        "plot",
        "eval",
        *map(str, eval_files),
        "-o",
        str(out),
        "--label",
        "b",
        "--label",
        "s20",
        "--label",
        "s50",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_cli_plot_eval_reports_a_file_without_summary(tmp_path):
    bad = tmp_path / "crashed.jsonl"
    bad.write_text(json.dumps(trajectory("nq", 0, True)) + "\n")
    result = CliRunner().invoke(main, ["plot", "eval", str(bad), "-o", str(tmp_path / "x.png")])
    assert result.exit_code != 0
    assert "crashed.jsonl" in result.output and "no summary" in result.output


# --- run figure --------------------------------------------------------------------------------


def write_metrics(path: Path, steps: int, keys: list[str]) -> Path:
    rows = [{"step": s, **{k: 0.1 * s + i for i, k in enumerate(keys)}} for s in range(1, steps + 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_run_figure_has_a_panel_per_logged_metric(tmp_path):
    logged = ["reward/mean", "reward/correct", "search/success_rate", "time/step_seconds"]
    rows = plots.load_run_metrics(write_metrics(tmp_path / "metrics.jsonl", 5, logged))
    fig, skipped = plots.run_figure(rows)
    assert len(fig.axes) == 4
    assert [ax.get_title() for ax in fig.axes] == [plots.metric_title(m) for m in logged]
    assert skipped == ["reward/format", "rollout/search_calls", "rollout/degenerate_group_rate", "trainer/loss_mean"]
    assert png_size(plots.save_figure(fig, tmp_path / "run.png")) == (1200, 800)


def test_run_figure_plots_the_logged_values(tmp_path):
    rows = plots.load_run_metrics(write_metrics(tmp_path / "m.jsonl", 4, ["reward/mean"]))
    fig, _ = plots.run_figure(rows, ["reward/mean"])
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4]
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_run_metrics_keep_the_last_row_of_a_repeated_step_and_skip_non_numbers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 2, "reward/mean": 0.5},
        {"step": 1, "reward/mean": None},
        {"step": 2, "reward/mean": 0.7},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = plots.load_run_metrics(path)
    assert plots.run_series(rows, "reward/mean") == ([2.0], [0.7])


def test_run_metrics_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"reward/mean": 1}\n')
    with pytest.raises(plots.PlotInputError, match=rf"{path}:2"):
        plots.load_run_metrics(path)


def test_run_figure_without_any_requested_metric_lists_what_exists(tmp_path):
    rows = plots.load_run_metrics(write_metrics(tmp_path / "m.jsonl", 2, ["trainer/loss"]))
    with pytest.raises(plots.PlotInputError, match="available: trainer/loss"):
        plots.run_figure(rows)


def test_cli_plot_run_from_a_run_directory_notes_skipped_metrics(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_metrics(run_dir / "metrics.jsonl", 3, ["reward/mean", "rollout/degenerate_group_rate"])
    out = tmp_path / "run.png"
    result = CliRunner().invoke(main, ["plot", "run", str(run_dir), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "note: reward/correct not logged" in result.output  # stderr is part of output
    assert png_size(out) == (1200, 800)


def test_cli_plot_run_with_chosen_metrics(tmp_path):
    path = write_metrics(tmp_path / "metrics.jsonl", 3, ["trainer/loss", "reward/mean"])
    out = tmp_path / "loss.png"
    result = CliRunner().invoke(main, ["plot", "run", str(path), "-o", str(out), "--metric", "trainer/loss"])
    assert result.exit_code == 0, result.output
    assert out.is_file()


# --- what the figures say ------------------------------------------------------------------------


def test_every_em_value_is_written_horizontally_just_above_its_upper_whisker(eval_files):
    fig = plots.eval_figure(plots.load_eval_runs(eval_files))
    top = fig.axes[0]
    labels = [t for t in top.texts if t.get_text()]
    expected = {}
    for path, correct in zip(eval_files, CHECKPOINTS.values()):
        metrics = load_summary(path)["metrics"]
        for source, k in correct.items():
            expected.setdefault(f"{100 * k / 10:.1f}", []).append(100 * metrics[f"em_ci95_high/{source}"])
    assert len(labels) == sum(len(v) for v in expected.values()) == 9
    for label in labels:
        assert label.get_rotation() == 0
        # anchored at the top of a whisker of that value
        assert any(label.xy[1] == pytest.approx(top_) for top_ in expected[label.get_text()])
        assert label.xyann[1] > 0 and label.get_va() == "bottom"  # and drawn above it


def test_a_benchmark_evaluated_with_different_sizes_shows_both_counts(tmp_path):
    small = write_eval_file(tmp_path / "small.jsonl", {"nq": 2}, per_source=4)
    large = write_eval_file(tmp_path / "large.jsonl", {"nq": 2}, per_source=10)
    ticks = plots.eval_figure(plots.load_eval_runs([small, large])).axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == ["nq\nn=4*/10"]  # 4 is under FEW_QUESTIONS: marked


def test_offline_evaluations_are_marked_in_the_title_and_live_ones_are_not(tmp_path):
    offline = write_eval_file(tmp_path / "offline.jsonl", {"nq": 2}, offline=True)
    live = write_eval_file(tmp_path / "live.jsonl", {"nq": 3})
    assert "OFFLINE" in plots.eval_figure(plots.load_eval_runs([offline])).get_suptitle()
    assert "OFFLINE" not in plots.eval_figure(plots.load_eval_runs([live])).get_suptitle()
    mixed = plots.eval_figure(plots.load_eval_runs([offline, live], ["scripted", "real"]))
    assert "MIXED" in mixed.get_suptitle()
    assert [t.get_text() for t in mixed.axes[0].get_legend().get_texts()] == ["scripted (offline)", "real"]


def test_default_labels_name_the_checkpoint_or_the_base_model(tmp_path):
    base = write_eval_file(tmp_path / "a.jsonl", {"nq": 1}, base_model="Qwen/Qwen3.5-9B")
    checkpoint = write_eval_file(tmp_path / "b.jsonl", {"nq": 1},
                                 model_path="trio://fake/run-0001/weights/demo-0a1b2c3d-step-000050-weights")
    assert [r.label for r in plots.load_eval_runs([base, checkpoint])] == [
        "Qwen3.5-9B (base)", "demo-0a1b2c3d-step-000050"]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_run_panels_have_integer_step_ticks(tmp_path):
    rows = plots.load_run_metrics(write_metrics(tmp_path / "m.jsonl", 3, ["reward/mean", "time/step_seconds"]))
    fig, _ = plots.run_figure(rows)
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)


@pytest.mark.parametrize("metric", ["reward/correct", "reward/format", "search/success_rate",
                                    "rollout/degenerate_group_rate", "rollout/termination/answer"])
def test_rates_sit_on_a_fixed_zero_to_one_axis_whatever_their_values(tmp_path, metric):
    for values in ([0.40, 0.45, 0.42], [0.0, 0.01, 0.02], [0.97, 1.0, 0.99]):
        rows = [{"step": s, metric: v} for s, v in enumerate(values)]
        fig, _ = plots.run_figure(rows, [metric])
        low, high = fig.axes[0].get_ylim()
        assert low <= 0 < 0.1 and 0.9 < 1 <= high < 1.1


def test_unbounded_metrics_follow_their_data(tmp_path):
    rows = [{"step": s, "time/step_seconds": 60 + s} for s in range(4)]
    low, high = plots.run_figure(rows, ["time/step_seconds"])[0].axes[0].get_ylim()
    assert 55 < low < 60 and 63 < high < 68


def test_a_smoothed_line_runs_over_the_raw_points(tmp_path):
    values = [0.0] * 10
    values[4] = 1.0
    rows = [{"step": s, "reward/correct": v} for s, v in enumerate(values)]
    fig, _ = plots.run_figure(rows, ["reward/correct"])
    raw, line = fig.axes[0].get_lines()
    assert list(raw.get_ydata()) == values and raw.get_linestyle() == "None"
    # ten points: the mean over one step either side, fewer at the ends
    assert list(line.get_ydata()) == pytest.approx([0, 0, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0, 0, 0])
    assert "centred mean over 3 steps" in " ".join(t.get_text() for t in fig.texts)
    few = plots.run_figure(rows[:4], ["reward/correct"])[0]
    assert len(few.axes[0].get_lines()) == 1  # too few points to average


@given(st.lists(st.floats(-1e6, 1e6), max_size=60), st.integers(0, 10))
def test_each_smoothed_value_lies_within_the_values_of_its_window(values, half_width):
    smoothed = plots.smooth(values, half_width)
    assert len(smoothed) == len(values)
    for i, value in enumerate(smoothed):
        window = values[max(0, i - half_width): i + half_width + 1]
        assert min(window) - 1e-6 <= value <= max(window) + 1e-6


@given(st.floats(-1e6, 1e6), st.integers(1, 60), st.integers(0, 10))
def test_smoothing_leaves_a_constant_series_constant(value, length, half_width):
    assert plots.smooth([value] * length, half_width) == pytest.approx([value] * length)


def test_the_loss_is_plotted_by_default():
    assert "trainer/loss_mean" in plots.DEFAULT_RUN_METRICS


def test_the_run_title_names_the_run_and_its_settings_and_marks_the_offline_twin(tmp_path):
    config = {"run_name": "zhihu-200", "base_model": "Qwen/Qwen3.5-4B", "lora_rank": 32, "questions_per_batch": 8,
              "learning_rate": 4e-5, "advantage_mode": "mean", "rollout": {"group_size": 8},
              "search": {"backend": "zhihu"}, "offline": False}
    title = plots.run_title(config, "fallback")
    for part in ("zhihu-200", "Qwen3.5-4B LoRA r32", "search zhihu", "8 questions x 8 samples", "lr 4e-05"):
        assert part in title
    assert "OFFLINE" not in title
    offline = plots.run_title({**config, "offline": True, "offline_policy": "learning"}, "fallback")
    assert "OFFLINE" in offline and "twin learning policy" in offline and "Qwen3.5" not in offline


def test_offline_evaluations_are_labelled_with_the_twins_policy_not_the_model(tmp_path):
    base = write_eval_file(tmp_path / "base.jsonl", {"nq": 1}, offline=True, sampling_backend="offline-learning")
    trained = write_eval_file(tmp_path / "trained.jsonl", {"nq": 2}, offline=True, sampling_backend="offline-learning",
                              model_path="trio://twin/run-0001/weights/demo-step-000020-weights")
    fig = plots.eval_figure(plots.load_eval_runs([base, trained]))
    labels = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    assert labels == ["twin learning policy (base)", "demo-step-000020 (twin learning policy)"]
    assert not any("Qwen" in text.get_text() for text in fig.texts)
    assert plots.run_title(None, "runs/x/metrics.jsonl") == "runs/x/metrics.jsonl"


def test_cli_plot_run_titles_the_figure_from_the_run_config(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_metrics(run_dir / "metrics.jsonl", 6, ["reward/mean"])
    (run_dir / "config.json").write_text(json.dumps({"run_name": "my-run", "offline": True}))
    out = tmp_path / "run.png"
    result = CliRunner().invoke(main, ["plot", "run", str(run_dir), "-o", str(out), "--smooth", "2"])
    assert result.exit_code == 0, result.output
    (run_dir / "config.json").write_text("{broken")
    broken = CliRunner().invoke(main, ["plot", "run", str(run_dir), "-o", str(out)])
    assert broken.exit_code == 1 and f"{run_dir / 'config.json'}: invalid JSON" in broken.output


@pytest.mark.parametrize(("args", "culprit"), [
    (["run", "RUN", "-o", "x.png", "--smooth", "-1"], "--smooth"),
    (["run", "RUN", "-o", "x.svg"], "--output"),
    (["run", "RUN", "-o", "x.png", "--metric", ""], "--metric"),
    (["eval", "EVAL", "-o", "x.png", "--label", ""], "--label"),
    (["eval", "EVAL", "-o", "x.jpg"], "--output"),
])
def test_impossible_plot_options_are_one_line_errors_naming_the_flag(eval_files, tmp_path, args, culprit):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_metrics(run_dir / "metrics.jsonl", 3, ["reward/mean"])
    args = [str(run_dir) if a == "RUN" else str(eval_files[0]) if a == "EVAL" else a for a in args]
    args = [str(tmp_path / a) if a.startswith("x.") else a for a in args]
    result = CliRunner().invoke(main, ["plot", *args])
    assert result.exit_code == 2, result.output
    assert culprit in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("x.*"))


def test_unhealthy_steps_are_marked_on_every_panel_and_health_draws_the_health_panel(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s, "health/entropy": 0.5 - 0.1 * s, "health/mismatch_k3": 0.01,
             "health/unhealthy": float(s >= 3)} for s in range(5)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert plots.unhealthy_steps(rows) == [3.0, 4.0]
    fig, _ = plots.run_figure(rows, ["reward/mean", "health/entropy"])
    for ax in fig.axes:
        vertical = [line for line in ax.get_lines()[1:] if line.get_color() == plots.UNHEALTHY_COLOR]
        assert sorted(line.get_xdata()[0] for line in vertical) == [3.0, 4.0]
    assert any("2 unhealthy steps" in text.get_text() for text in fig.texts)
    out = tmp_path / "health.png"
    result = CliRunner().invoke(main, ["plot", "run", str(run_dir), "-o", str(out), "--health"])
    assert result.exit_code == 0, result.output
    assert "note: health/action_tokens_p95 not logged" in result.output and "note: health/entropy" not in result.output
    assert png_size(out) == (1200, 800)


def test_eval_figure_plots_the_chosen_answer_metric(tmp_path):
    records = [{**trajectory("nq", i, i < 2), "f1": 0.25 * (i % 4), "cover_em": i < 6} for i in range(8)]
    summary = summary_record(records, config=BASE_CONFIG, search_metrics={}, partial=False)
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*records, summary]), encoding="utf-8")
    runs = plots.load_eval_runs([path])
    heights = {metric: plots.eval_figure(runs, metric).axes[0].patches[0].get_height()
               for metric in ("em", "f1", "cover_em")}
    assert heights == pytest.approx({"em": 25.0, "f1": 100 * (0 + .25 + .5 + .75) * 2 / 8, "cover_em": 75.0})
    assert "F1" in plots.eval_figure(runs, "f1").axes[0].get_title()


# --- what a reader sees: every legend entry matches something drawn, one colour one meaning, ------
# --- labels that never overlap, readable panels, gaps marked --------------------------------------


def _colour(value) -> tuple:
    from matplotlib.colors import to_rgba

    return tuple(round(c, 3) for c in to_rgba(value))


def test_every_legend_entry_matches_something_visible_even_a_score_of_zero(tmp_path):
    zero = write_eval_file(tmp_path / "zero.jsonl", {"nq": 0, "popqa": 0})
    some = write_eval_file(tmp_path / "some.jsonl", {"nq": 5, "popqa": 3}, model_path="trio://run/step10-weights")
    top = plots.eval_figure(plots.load_eval_runs([zero, some])).axes[0]
    handles = top.get_legend().legend_handles
    for handle in handles:
        colour = _colour(handle.get_facecolor())
        tall = [p for p in top.patches if _colour(p.get_facecolor()) == colour and p.get_height() > 0]
        strokes = [c for c in top.collections if any(_colour(rgba) == colour for rgba in c.get_colors())
                   and c.get_linewidth()[0] >= 2]
        assert tall or strokes, f"nothing drawn in the colour of {handle.get_label()}"


def test_the_lower_panel_gives_each_checkpoint_the_colour_it_has_above(eval_files):
    top, bottom = plots.eval_figure(plots.load_eval_runs(eval_files)).axes
    per_source = len(top.get_xticks())
    above = [_colour(top.patches[i * per_source].get_facecolor()) for i in range(len(eval_files))]
    assert len(set(above)) == len(eval_files)
    macro = [_colour(p.get_facecolor()) for p in bottom.patches if p.get_gid() == "macro"]
    formats = [_colour(p.get_edgecolor()) for p in bottom.patches if p.get_gid() == "format rate"]
    assert macro == above and formats == above
    # and no other colour carries a meaning there: the legend explains the two kinds in grey
    legend = [_colour(h.get_facecolor()) for h in bottom.get_legend().legend_handles]
    assert not set(legend) & set(above)


def _overlapping_texts(ax) -> list[tuple[str, str]]:
    renderer = ax.figure.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
    return [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]


@pytest.mark.parametrize("checkpoints", [1, 3, 6])
def test_no_two_value_labels_overlap(tmp_path, checkpoints):
    sources = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
    files = [write_eval_file(tmp_path / f"e{i}.jsonl", {s: (i + j) % 11 for j, s in enumerate(sources)},
                             model_path=f"trio://run/step{i}-weights") for i in range(checkpoints)]
    # the same macro EM and format rate put the two labels of a checkpoint in the same place
    files.append(write_eval_file(tmp_path / "all.jsonl", {s: 10 for s in sources},
                                 model_path="trio://run/full-weights"))
    fig = plots.eval_figure(plots.load_eval_runs(files))
    fig.canvas.draw()
    for ax in fig.axes:
        assert _overlapping_texts(ax) == []


@pytest.mark.parametrize("panels", [plots.DEFAULT_RUN_METRICS, plots.HEALTH_RUN_METRICS], ids=["default", "health"])
def test_run_panels_have_readable_titles_and_a_labelled_y_axis(tmp_path, panels):
    logged = list(panels)
    rows = plots.load_run_metrics(write_metrics(tmp_path / "m.jsonl", 6, logged))
    fig, _ = plots.run_figure(rows, logged)
    assert len(fig.axes) == len(logged)
    for ax in fig.axes:
        assert "/" not in ax.get_title() and ax.get_ylabel()


def test_a_metric_that_never_changes_gets_a_footnote_not_a_panel_unless_asked_for(tmp_path):
    rows = [{"step": s, "reward/mean": 0.1 * s, "search/success_rate": 1.0} for s in range(6)]
    fig, _ = plots.run_figure(rows, ["reward/mean", "search/success_rate"], leave_out_constant=True)
    assert [ax.get_title() for ax in fig.axes] == ["Mean reward"]
    assert "search/success_rate = 1" in " ".join(t.get_text() for t in fig.texts)
    asked, _ = plots.run_figure(rows, ["reward/mean", "search/success_rate"])
    assert len(asked.axes) == 2


def test_cli_plot_run_says_which_metric_it_left_out_for_being_constant(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s, "search/success_rate": 1.0}) + "\n"
                            for s in range(4)))
    result = CliRunner().invoke(main, ["plot", "run", str(path), "-o", str(tmp_path / "r.png")])
    assert result.exit_code == 0, result.output
    assert "note: search/success_rate is 1 at every step; left out" in result.output


def span_centre(patch) -> float:
    """The middle, in data x, of a patch drawn by ``axvspan`` (a ``Rectangle`` from matplotlib 3.9,
    a ``Polygon`` before): its outline's x extent in the coordinates of its own transform."""
    xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
    return (xs.min() + xs.max()) / 2


@pytest.mark.parametrize("points", [4, 12])  # drawn as a plain line, and as dots under a smoothed line
def test_steps_without_a_value_are_shaded_and_no_line_crosses_them(points):
    rows = [{"step": s, "reward/mean": 0.5, "trainer/loss_mean": 0.01 * s} for s in range(points)]
    gap = {1, 2} if points == 4 else {5, 6, 7}
    for s in gap:
        del rows[s]["trainer/loss_mean"]
    fig, _ = plots.run_figure(rows, ["reward/mean", "trainer/loss_mean"])
    reward, loss = fig.axes
    assert reward.get_xlim() == loss.get_xlim() == (-0.5, points - 0.5)  # every panel over the same steps
    shaded = sorted(span_centre(p) for p in loss.patches)
    assert shaded == pytest.approx(sorted(gap))
    for line in loss.get_lines():
        if line.get_linestyle() == "None":
            continue
        xs = [x for x in line.get_xdata()]
        ys = list(line.get_ydata())
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if y0 == y0 and y1 == y1:  # a drawn segment (NaN breaks the line)
                assert not any(x0 < g < x1 for g in gap), f"the line crosses the missing steps {gap}"


def whiskers(ax) -> list[tuple[float, float]]:
    """(low, high) of every error bar drawn on ``ax``, in data units."""
    found = []
    for container in ax.containers:
        if getattr(container, "errorbar", None) is not None:
            for segment in container.errorbar.lines[2][0].get_segments():
                found.append((float(segment[0][1]), float(segment[1][1])))
    return found


def test_error_bars_keep_their_length_at_one_question_a_source_even_from_a_file_written_with_a_bootstrap(tmp_path):
    """One question a source, each right or wrong: every bar (per source and macro) has a
    whisker of real length. A file whose stored intervals came from a percentile bootstrap
    (a point here) is drawn with today's intervals, from its records."""
    path = write_eval_file(tmp_path / "one.jsonl", {"nq": 1, "popqa": 0, "hotpotqa": 1}, per_source=1)
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    for key in list(lines[-1]["metrics"]):
        if "_ci95_" in key:  # what the bootstrap stored: the estimate itself
            lines[-1]["metrics"][key] = lines[-1]["metrics"][key.replace("_ci95_low", "").replace("_ci95_high", "")]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    fig = plots.eval_figure(plots.load_eval_runs([path]))
    top, bottom = fig.axes
    assert sorted(t.get_text() for t in top.get_xticklabels()) == ["hotpotqa\nn=1*", "nq\nn=1*", "popqa\nn=1*"]
    drawn = whiskers(top) + whiskers(bottom)
    assert len(drawn) == 4 and all(high - low > 50 for low, high in drawn)  # percentage points

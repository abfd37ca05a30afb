"""What training prints: one plain line per step in logs and with --quiet, bars only on a
terminal, step lines that fit the terminal, and no "3/2" when a finished run is resumed."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from searchr1.run.progress import (
    CountingBar,
    Field,
    LineReporter,
    RichReporter,
    fit_line,
    make_reporter,
    step_fields,
    step_summary,
)

METRICS = {"time/step_seconds": 12.5, "trainer/loss_mean": -0.0123, "reward/mean": 0.4, "reward/correct": 0.45,
           "reward/format": 0.9, "rollout/search_calls": 1.25, "rollout/degenerate_group_rate": 0.125,
           "train/datums_per_rollout_batch": 56, "train/tokens_sent": 123456}
ANSI = re.compile(r"\x1b\[")
CONTROL_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(output: str) -> list[str]:
    """The lines a terminal ends up showing: escape sequences removed, a carriage return
    overwriting what came before it on its line."""
    return [CONTROL_SEQUENCE.sub("", line).rsplit("\r", 1)[-1] for line in output.split("\n")]


def terminal(width: int = 100) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=width, color_system=None), buffer


def log_file() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False), buffer


# --- fitting a step line (pure) -------------------------------------------------------------------

fields = st.lists(st.tuples(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
                            st.integers(1, 9)), max_size=10, unique_by=lambda field: field[0])


@given(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=10), fields,
       st.integers(0, 120))
def test_a_fitted_line_is_never_wider_than_asked_and_keeps_the_first_field(first, rest, width):
    pieces = [Field(first, 0)] + [Field(text, rank) for text, rank in rest]
    line = fit_line(pieces, width)
    assert len(line) <= width
    if len(first) <= width:
        assert line.startswith(first)


@given(fields, st.integers(0, 120))
def test_a_fitted_line_drops_the_least_important_fields_first_and_keeps_the_order(rest, width):
    pieces = [Field("step", 0)] + [Field(text, rank) for text, rank in rest if text != "step"]
    line = fit_line(pieces, max(width, len("step")))
    kept_texts = line.split("  ")
    # the kept fields are a prefix-preserving subsequence of the pieces
    kept, position = [], 0
    for text in kept_texts:
        while pieces[position].text != text:
            position += 1
        kept.append(pieces[position])
        position += 1
    dropped = [p for p in pieces if all(p is not k for k in kept)]
    if dropped:
        assert max(k.rank for k in kept) <= min(d.rank for d in dropped)


def test_without_a_width_the_whole_line_is_kept():
    line = step_summary(3, METRICS)
    assert line == "  ".join(f.text for f in step_fields(3, METRICS))
    for piece in ("step    3", "loss -0.0123", "reward +0.400", "tokens 123456"):
        assert piece in line


def test_a_narrow_terminal_keeps_the_step_and_the_reward():
    line = step_summary(7, METRICS, width=40)
    assert len(line) <= 40 and line.startswith("step    7") and "reward +0.400" in line
    assert "tokens" not in line


# --- reporters --------------------------------------------------------------------------------------


def test_outside_a_terminal_each_step_is_one_plain_whole_line():
    console, buffer = log_file()
    reporter = make_reporter(console=console)
    assert isinstance(reporter, LineReporter)
    reporter.start(3, 0)
    for step in range(3):
        reporter.start_step(step, 64)
        reporter.trajectory_done(64)
        reporter.end_step(step, METRICS)
    reporter.note("checkpoint demo-final: state trio://fake/run-0001/state/" + "x" * 120)
    reporter.close()
    lines = buffer.getvalue().splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [["step", "0"], ["step", "1"], ["step", "2"]]
    assert lines[0] == step_summary(0, METRICS)  # whole, not cut to 80 columns
    assert lines[3].endswith("x" * 120) and len(lines) == 4  # the note is not wrapped either
    assert not ANSI.search(buffer.getvalue()) and "━" not in buffer.getvalue()


def test_quiet_on_a_terminal_keeps_the_step_lines_fitted_to_its_width():
    console, buffer = terminal(width=60)
    reporter = make_reporter(quiet=True, console=console)
    assert isinstance(reporter, LineReporter)
    reporter.start(1, 0)
    reporter.end_step(0, METRICS)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step    0") and len(lines[0]) <= 60
    assert "━" not in buffer.getvalue()


def test_a_terminal_gets_bars_and_step_lines_that_do_not_wrap():
    console, buffer = terminal(width=70)
    reporter = make_reporter(console=console)
    assert isinstance(reporter, RichReporter)
    reporter.start(2, 0)
    reporter.start_step(0, 4)
    reporter.trajectory_done(4)
    reporter.end_step(0, METRICS)
    reporter.close()
    output = buffer.getvalue()
    step_lines = [line for line in screen_lines(output) if line.startswith("step    0")]
    assert step_lines and all(len(line) <= 70 for line in step_lines)
    assert "1/2" in output


def test_resuming_a_finished_run_with_fewer_steps_never_shows_more_done_than_planned():
    console, buffer = terminal(width=100)
    reporter = RichReporter(console)
    reporter.start(2, 3)  # three steps finished, --max-steps 2
    reporter.close()
    output = buffer.getvalue()
    assert "3/2" not in output and "2/2" in output
    assert "nothing to run: 3 steps already finished and --max-steps is 2" in output
    console, buffer = log_file()
    make_reporter(console=console).start(2, 3)
    assert "nothing to run" in buffer.getvalue() and "3/2" not in buffer.getvalue()


def test_a_counting_bar_is_silent_outside_a_terminal_and_shown_on_one():
    console, buffer = log_file()
    with CountingBar("questions", 5, console=console) as bar:
        bar.advance(5)
    assert buffer.getvalue() == ""
    console, buffer = terminal()
    with CountingBar("questions", 5, console=console) as bar:
        bar.advance(5)
    assert "5/5" in buffer.getvalue()


# --- the train command, in a log (CliRunner's output is not a terminal) ----------------------------

SMALL = ["train", "--offline", "--questions-per-batch", "2", "--group-size", "2"]


def train(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from searchr1.cli import main

    result = CliRunner().invoke(main, [*SMALL, *map(str, args)])
    return result.exit_code, result.output


def step_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("step ")]


@pytest.mark.slow  # a training run through the CLI
def test_training_in_a_log_prints_one_whole_line_per_step_and_no_bars(tmp_path):
    code, output = train("--max-steps", "2", "--run-dir", tmp_path / "run")
    assert code == 0, output
    lines = step_lines(output)
    assert [line.split()[:2] for line in lines] == [["step", "0"], ["step", "1"]]
    assert all("reward" in line and "tokens" in line for line in lines)  # whole lines, not wrapped
    assert "━" not in output and not ANSI.search(output)


@pytest.mark.slow  # a training run through the CLI
def test_quiet_training_keeps_the_step_lines(tmp_path):
    code, output = train("--max-steps", "2", "--quiet", "--run-dir", tmp_path / "run")
    assert code == 0, output
    assert len(step_lines(output)) == 2


@pytest.mark.slow  # a training run through the CLI
def test_resuming_a_three_step_run_with_max_steps_two_runs_nothing_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--max-steps", "3", "--run-dir", run_dir)[0] == 0
    code, output = train_resume(run_dir, "--max-steps", "2")
    assert code == 0, output
    assert "3/2" not in output
    assert "nothing to run: 3 steps already finished and --max-steps is 2" in output
    assert step_lines(output) == []


def train_resume(run_dir, *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from searchr1.cli import main

    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), *args])
    return result.exit_code, result.output


def test_the_step_line_shows_the_entropy_and_says_when_a_step_is_unhealthy():
    healthy = step_summary(3, {**METRICS, "health/entropy": 0.4567, "health/mismatch_k3": 0.00123})
    assert "entropy 0.457" in healthy and "k3 0.0012" in healthy and "UNHEALTHY" not in healthy
    sick = step_summary(3, {**METRICS, "health/unhealthy": 1.0}, width=60)
    assert "UNHEALTHY" in sick and sick.startswith("step    3")

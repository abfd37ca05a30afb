"""A run can be run again from its record: ``train --config RUN`` (or ``RUN/config.json``) into a
new directory gives the same metrics step for step, records the same settings, and leaves the
recorded run as it was; a flag on the command line beats the record."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from twin_support import without_timing_metrics

from searchr1.cli import main
from searchr1.run.directory import RunDir

# Settings away from their defaults, among them those config.json records under another name
# (--advantage, the system prompt file's text, the NAME=VALUE flags as objects).
OPTIONS = ["--max-steps", "3", "--questions-per-batch", "3", "--group-size", "4", "--learning-rate", "0.3",
           "--advantage", "rloo", "--loss-fn", "ppo", "--loss-fn-config", "clip_high_threshold=1.3",
           "--health-rule", "repeated_turns=0.7", "--max-search-calls", "3", "--seed", "7"]


def train(*args: str) -> str:
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", *args])
    assert result.exit_code == 0, result.output
    return result.output


def files_of(run: Path) -> dict[str, bytes]:
    return {str(path.relative_to(run)): path.read_bytes() for path in sorted(run.rglob("*")) if path.is_file()}


def comparable(run: Path) -> list[dict]:
    return [without_timing_metrics(line) for line in RunDir(run).metrics()]


def test_a_run_again_from_its_record_repeats_its_metrics_step_for_step(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You answer questions. Search at most {max_search_calls} times, then write Answer: X.")
    first, again, from_file = tmp_path / "first", tmp_path / "again", tmp_path / "from-file"
    train("--run-dir", str(first), "--system-prompt-file", str(prompt), *OPTIONS)
    before = files_of(first)
    prompt.unlink()  # the record holds the prompt's text: the file is not needed again
    train("--config", str(first), "--run-dir", str(again))
    train("--config", str(first / "config.json"), "--run-dir", str(from_file))
    assert files_of(first) == before  # the recorded run is left as it was
    expected = comparable(first)
    assert [line["step"] for line in expected] == [0, 1, 2]
    assert comparable(again) == expected and comparable(from_file) == expected
    recorded = json.loads((first / "config.json").read_text())
    for run in (again, from_file):
        repeated = json.loads((run / "config.json").read_text())
        assert repeated["run_id"] != recorded["run_id"]  # a new run: its own checkpoint names
        assert {**repeated, "run_id": recorded["run_id"]} == recorded
    assert recorded["rollout"]["system_prompt"].startswith("You answer questions.")


def test_a_flag_on_the_command_line_beats_the_record_and_the_default_directory_is_new(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "runs" / "search-r1-qwen35-4b"
    train("--max-steps", "1", "--questions-per-batch", "2", "--group-size", "4", "--advantage", "zscore")
    assert (first / "metrics.jsonl").is_file()
    output = train("--config", str(first), "--group-size", "2")
    again = tmp_path / "runs" / "search-r1-qwen35-4b-2"
    assert f"run directory: {Path('runs') / 'search-r1-qwen35-4b-2'}" in output
    repeated = json.loads((again / "config.json").read_text())
    assert repeated["rollout"]["group_size"] == 2 and repeated["advantage_mode"] == "zscore"
    assert repeated["questions_per_batch"] == 2 and repeated["max_steps"] == 1
    assert json.loads((first / "config.json").read_text())["rollout"]["group_size"] == 4


def test_a_run_again_never_writes_over_the_run_it_reads(tmp_path, monkeypatch):
    """Neither named with --run-dir nor as the default directory, even when that run never
    finished a step (a directory any new run could otherwise take)."""
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "runs" / "search-r1-qwen35-4b"
    train("--max-steps", "1", "--questions-per-batch", "2", "--group-size", "4")
    result = CliRunner().invoke(main, ["train", "--config", str(first), "--run-dir", str(first)])
    assert result.exit_code == 2 and f"--run-dir {first} is the run --config reads" in result.output
    result = CliRunner().invoke(main, ["train", "--config", str(first), "--resume", str(first)])
    assert result.exit_code == 2 and "use one of them" in result.output
    for name in ("metrics.jsonl", "checkpoints.jsonl", "run_state.json"):
        (first / name).unlink()  # as a run stopped before its first step leaves it
    record = (first / "config.json").read_bytes()
    output = train("--config", str(first))
    assert f"run directory: {Path('runs') / 'search-r1-qwen35-4b-2'}" in output
    assert (first / "config.json").read_bytes() == record

"""Partial rollouts end to end on the offline twin: a killed run resumes exactly (groups carried
over a checkpoint are rolled out again on the recorded samplers and trained by the same steps),
the bound cuts what would lag too far, and bad flag combinations are one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.run.directory import RunDir
from twin_support import killed_resumed_and_straight, without_timing_metrics

BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]
PARTIAL = ["--max-steps-off-policy", "1", "--partial-rollouts", "--turns-per-version", "1"]


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("bound", [[], ["--max-version-lag", "1"], ["--max-steps-off-policy", "2", "--max-version-lag", "4"]],
                         ids=["carried", "cut", "k2"])
def test_a_killed_partial_run_resumes_at_its_checkpoint_and_matches_an_uninterrupted_run(tmp_path, bound):
    args = [*BASE, *PARTIAL, *bound, "--max-steps", "6", "--save-every", "2", "--run-dir"]
    killed, resumed, straight = killed_resumed_and_straight(args, tmp_path)
    assert [m["step"] for m in resumed] == list(range(6))
    assert resumed == straight
    lag = int(json.loads((killed / "config.json").read_text())["max_version_lag"])
    for line in resumed:  # every trained trajectory's oldest turn lags its step by 0..S versions
        shares = sum(line[f"async/oldest_turn_lag/{age}"] for age in range(lag + 1))
        assert shares == pytest.approx(1.0) or line["train/groups_trained"] == 0 == shares
    if bound == ["--max-version-lag", "1"]:  # S = K: one turn per trajectory, none carried
        assert all(m["async/groups_carried"] == 0 for m in resumed)
        assert sum(m["async/cut_by_lag"] for m in resumed) > 0
    else:
        assert sum(m["async/groups_carried"] for m in resumed) > 0
        assert max(m["async/versions_per_trajectory"] for m in resumed) > 1


@pytest.mark.parametrize("args, message", [
    (["--partial-rollouts"], "--partial-rollouts needs --max-steps-off-policy K >= 1"),
    (["--partial-rollouts", "--max-steps-off-policy", "2", "--max-version-lag", "1"],
     "--max-version-lag 1 is below --max-steps-off-policy 2"),
    (["--partial-rollouts", "--max-steps-off-policy", "1", "--turns-per-version", "0"], "--turns-per-version"),
])
def test_bad_partial_rollout_flags_are_one_line(tmp_path, args, message):
    code, output = run_cli(*BASE, *args, "--max-steps", "2", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and message in output and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], output  # click's usage lines, then the one error
    assert not (tmp_path / "run").exists()


def test_a_quantum_longer_than_every_trajectory_trains_as_the_bounded_overlap_does(tmp_path):
    """With T past the turn budget no trajectory moves on and no group is carried: every metric but
    the pipeline's own async/ view equals --max-steps-off-policy 1's."""
    common = [*BASE, "--max-steps", "4", "--max-steps-off-policy", "1", "--run-dir"]
    code, output = run_cli(*common, str(tmp_path / "bounded"))
    assert code == 0, output
    code, output = run_cli(*common, str(tmp_path / "partial"), "--partial-rollouts", "--turns-per-version", "100",
                           "--max-version-lag", "1")
    assert code == 0, output

    def lines(name: str) -> list[dict]:
        return [{k: v for k, v in without_timing_metrics(m).items() if not k.startswith("async/")}
                for m in RunDir(tmp_path / name).metrics()]

    assert lines("partial") == lines("bounded") and len(lines("bounded")) == 4
    assert all(m["async/groups_carried"] == 0 and m["async/oldest_turn_lag/1"] in (0.0, 1.0)
               for m in RunDir(tmp_path / "partial").metrics())

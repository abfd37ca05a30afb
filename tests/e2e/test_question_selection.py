"""The probe, the filters and the curriculum end to end on the offline twin: probe-data finds the
known questions, train drops them and draws with the curriculum, a killed run resumes exactly,
and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.offline import MIXED_TRAIN, load_source, KNOWN
from searchr1.run.directory import RunDir
from twin_support import killed_resumed_and_straight

BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4", "--data", str(MIXED_TRAIN)]


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "mixed.probe.jsonl"
    code, output = run_cli("probe-data", "--offline", "--quiet", "--attempts", "8", "--output", str(path))
    assert code == 0, output
    return path


def test_the_probe_finds_the_questions_the_base_twin_knows(probe):
    """Every known question is answered right closed-book at least once in 8 attempts, no other
    question ever is (the twin's guess at them is wrong), and the file names the twin's policy."""
    lines = [json.loads(line) for line in probe.read_text().splitlines()]
    assert lines[0]["config"]["policy"] == "twin learning policy (untrained)"
    known = {item["id"] for item in load_source(KNOWN)["train"]}
    guessed = {line["id"] for line in lines if line["type"] == "question" and line["closed_book"]["right"] > 0}
    assert guessed == known
    assert lines[-1]["type"] == "summary" and lines[-1]["questions"] == 20


def test_a_resumed_probe_adds_only_what_it_lacks(tmp_path, probe):
    path = tmp_path / "p.jsonl"
    code, output = run_cli("probe-data", "--offline", "--quiet", "--limit", "5", "--output", str(path))
    assert code == 0, output
    code, output = run_cli("probe-data", "--offline", "--quiet", "--output", str(path))
    assert code == 0 and "15 questions probed, 5 already in" in output, output
    def rates(text: str) -> list[dict[str, object]]:  # usage's request counts follow the search cache's history
        return [{k: v for k, v in json.loads(line).items() if k != "usage"} for line in text.splitlines()[1:-1]]

    assert rates(path.read_text()) == rates(probe.read_text())  # as one session made it
    code, output = run_cli("probe-data", "--offline", "--quiet", "--attempts", "4", "--output", str(path))
    assert code == 1 and "other settings (attempts, closed_book, with_tools differ)" in output, output


@pytest.mark.parametrize("off_policy", [[], ["--max-steps-off-policy", "1"]], ids=["on-policy", "off-policy"])
def test_a_filtered_curriculum_run_resumes_exactly(tmp_path, probe, off_policy):
    args = [*BASE, "--probe", str(probe), "--drop-guessable", "1", "--curriculum", *off_policy,
            "--max-steps", "6", "--save-every", "2", "--run-dir"]
    killed, resumed, straight = killed_resumed_and_straight(args, tmp_path)
    assert resumed == straight and len(resumed) == 6
    assert all(line["data/guessable_share"] == 0.0 for line in resumed)  # every known question dropped
    config = json.loads((killed / "config.json").read_text())
    assert sorted(config["dropped_questions"]["guessable"]) == sorted(i["id"] for i in load_source(KNOWN)["train"])
    steps = [json.loads(line)["step"] for line in (killed / "curriculum.jsonl").read_text().splitlines()]
    assert steps == list(range(6))


def test_a_uniform_run_with_a_probe_reports_its_guessable_share(tmp_path, probe):
    code, output = run_cli(*BASE, "--probe", str(probe), "--max-steps", "3", "--run-dir", str(tmp_path / "r"))
    assert code == 0, output
    shares = [line["data/guessable_share"] for line in RunDir(tmp_path / "r").metrics()]
    assert any(share > 0 for share in shares)  # the known questions come in their turn


def test_bad_question_selection_flags_are_one_line(tmp_path, probe):
    code, output = run_cli(*BASE, "--drop-guessable", "1", "--run-dir", str(tmp_path / "a"))
    assert code == 2 and "--drop-guessable needs --probe FILE" in output, output
    code, output = run_cli(*BASE, "--curriculum", "--dynamic-sampling", "--run-dir", str(tmp_path / "b"))
    assert code == 2 and "--curriculum does not go with --dynamic-sampling" in output, output
    other = tmp_path / "other.probe.jsonl"
    lines = probe.read_text().splitlines()
    record = json.loads(lines[1])
    record["question"] = "a question of another dataset?"
    other.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    code, output = run_cli(*BASE, "--probe", str(other), "--drop-guessable", "1", "--run-dir", str(tmp_path / "c"))
    assert code == 2 and "the probe is of another dataset" in output and "Traceback" not in output, output
    assert not (tmp_path / "c").exists()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not json\n{}\n")
    code, output = run_cli(*BASE, "--probe", str(broken), "--run-dir", str(tmp_path / "d"))
    assert code == 1 and f"probe file {broken}, line 1: not JSON" in output, output


def test_a_resume_refuses_a_probe_that_changed(tmp_path, probe):
    copy = tmp_path / "p.jsonl"
    copy.write_bytes(probe.read_bytes())
    run_dir = tmp_path / "r"
    code, output = run_cli(*BASE, "--probe", str(copy), "--curriculum", "--max-steps", "2", "--run-dir", str(run_dir))
    assert code == 0, output
    copy.write_text(copy.read_text().replace('"right": 0', '"right": 1', 1))
    code, output = run_cli(*BASE[:2], "--resume", str(run_dir), "--max-steps", "3")
    assert code == 1 and f"probe file {copy} changed since the run started" in output, output

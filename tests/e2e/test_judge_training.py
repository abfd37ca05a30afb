"""``train --judge deepseek-chat --judge-weight W`` end to end, offline: a DeepSeek judge's calls
over an offline run's answers are recorded into a cassette (a fake DeepSeek answering by the
twin's rule, reached through :func:`searchr1.commands.eval.deepseek_transport`), and
``train --offline --judge deepseek-chat --judge-cassette PATH`` replays them: the same rewards,
``usage/judge_deepseek_*`` counted, no key written anywhere. An answer the cassette lacks is a
judge failure, so an environment failure: its group left out, never a reward, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.commands import eval as eval_command
from searchr1.evaluation.transcripts import read_run_transcripts
from searchr1.run.directory import RunDir
from searchr1.twin.judge import rule
from twin_support import without_timing_metrics

KEY = "sk-fake-deepseek-judge-0123456789abcdef"
BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4", "--max-steps", "2",
        "--transcripts-per-step", "16", "--judge", "deepseek-chat", "--judge-weight", "0.5", "--judge-cache", "off"]
FIELDS = re.compile(r"GOLD ANSWERS: (?P<gold>\[.*?\])\nPREDICTION: (?P<prediction>[^\n]*)\n", re.S)


def fake_deepseek(request: httpx.Request) -> httpx.Response:
    """DeepSeek's chat API answering the judge prompt by the twin's documented rule."""
    assert request.url == "https://api.deepseek.com/chat/completions"
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    prompt = json.loads(request.content)["messages"][0]["content"]
    fields = FIELDS.search(prompt)
    assert fields is not None, prompt
    verdict = "yes" if rule(json.loads(fields["gold"]), fields["prediction"]) else "no"
    return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": verdict}}],
                                     "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 1}})


def train(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*BASE, *args])
    return result.exit_code, result.output + (f"{result.exception!r}" if result.exception and result.exit_code else "")


def record_offline_run(monkeypatch: pytest.MonkeyPatch, cassette: Path, run_dir: Path) -> tuple[int, str]:
    """An offline run whose DeepSeek judge is live (the fake one) and records ``cassette``: the
    judge's check and construction take the live path, as they do in a live run."""
    check_judge, make_judge = eval_command.check_judge, eval_command.make_judge
    with monkeypatch.context() as patched:
        patched.setenv("DEEPSEEK_API_KEY", KEY)
        patched.setattr(eval_command, "deepseek_transport", lambda: httpx.MockTransport(fake_deepseek))
        patched.setattr(eval_command, "check_judge", lambda model, **kw: check_judge(model, **{**kw, "offline": False}))
        patched.setattr(eval_command, "make_judge", lambda model, **kw: make_judge(model, **{**kw, "offline": False}))
        return train("--judge-cassette", str(cassette), "--run-dir", str(run_dir))


def transcribed(run_dir: Path) -> list[dict]:
    return [r for step in read_run_transcripts(run_dir / "transcripts.jsonl").by_step.values() for r in step]


def files_holding(text: str, *roots: Path) -> list[Path]:
    return [path for root in roots for path in root.rglob("*")
            if path.is_file() and text.encode() in path.read_bytes()]


def test_a_deepseek_judge_recorded_over_an_offline_run_replays_it_offline(tmp_path, monkeypatch):
    cassette, recorded, replayed = tmp_path / "judge.yaml", tmp_path / "recorded", tmp_path / "replayed"
    code, output = record_offline_run(monkeypatch, cassette, recorded)
    assert code == 0, output
    assert cassette.is_file() and "Authorization" not in cassette.read_text("utf-8")

    code, output = train("--judge-cassette", str(cassette), "--run-dir", str(replayed))
    assert code == 0, output
    lines = RunDir(replayed).metrics()
    assert [without_timing_metrics(m) for m in lines] == [without_timing_metrics(m) for m in RunDir(recorded).metrics()]
    judged = [{k: v for k, v in m.items() if k.startswith(("usage/judge", "usage/total_judge"))} for m in lines]
    assert judged == [{k: v for k, v in m.items() if k.startswith(("usage/judge", "usage/total_judge"))}
                      for m in RunDir(recorded).metrics()]  # asked what the recording run asked (no cache)
    for line in lines:
        assert line["usage/judge_deepseek_calls"] >= line["usage/judge_deepseek_requests"] > 0
        assert line["usage/judge_deepseek_prompt_tokens"] > 0 and line["reward/judge_failed"] == 0
        assert not any(key.startswith("usage/judge_pytrio") for key in line)
    requests = len(yaml.safe_load(cassette.read_text("utf-8"))["interactions"])
    assert sum(line["usage/judge_deepseek_requests"] for line in lines) == requests  # one request per answer

    records = transcribed(replayed)
    assert [r["reward"] for r in records] == [r["reward"] for r in transcribed(recorded)]
    answered = [r for r in records if r["valid_format"]]
    assert answered and all(r["judge"]["model"] == "deepseek-chat" for r in answered)
    for record in answered:  # the fake's verdicts are the twin's rule, mixed in at weight 0.5
        gold, prediction = record["answers"], record["judge"]["reply"]
        assert prediction in ("yes", "no") and record["judge"]["correct"] == (prediction == "yes")
        assert record["reward"] == pytest.approx(0.5 * record["exact_match"] + 0.5 * record["judge"]["correct"])
        assert record["judge"]["correct"] or not record["exact_match"], gold  # the rule accepts an exact match
    assert files_holding(KEY, tmp_path) == []  # neither the cassette nor any file of either run


def test_an_answer_the_cassette_lacks_is_a_judge_failure_and_its_group_is_left_out(tmp_path, monkeypatch):
    cassette, recorded = tmp_path / "judge.yaml", tmp_path / "recorded"
    code, output = record_offline_run(monkeypatch, cassette, recorded)
    assert code == 0, output
    data = yaml.safe_load(cassette.read_text("utf-8"))
    kept = data["interactions"][::2]  # every other answer forgotten
    assert 0 < len(kept) < len(data["interactions"])
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump({**data, "interactions": kept}), "utf-8")

    replayed = tmp_path / "replayed"
    code, output = train("--judge-cassette", str(partial), "--run-dir", str(replayed))
    assert code == 0, output
    assert "Traceback" not in output
    lines = RunDir(replayed).metrics()
    assert any(line["reward/judge_failed"] > 0 for line in lines)
    assert all(line["rollout/env_failure_group_rate"] > 0 for line in lines if line["reward/judge_failed"] > 0)
    failed = [r for r in transcribed(replayed) if r.get("judge", {}).get("error")]
    assert failed and all("holds no answer to this prompt" in r["judge"]["error"] for r in failed)
    assert all(r["excluded"] for r in failed)  # left out of the update, not trained on a made-up reward
    assert all(r["reward"] == pytest.approx(float(r["exact_match"])) for r in failed)  # the rule's score, unmixed

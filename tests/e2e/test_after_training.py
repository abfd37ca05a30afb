"""After training, offline end to end through the real pytrio client against the twin: export
(download, safe extraction, the adapter, hostile archives), ask, eval --judge twin, compare
two checkpoints, plot eval of several, and the card of --protocol search-r1."""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.evaluation.metrics import load_summary, read_eval_records

STEPS = (2, 6)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A 6-step offline run checkpointed every 2 steps, and judged evals of steps 2 and 6."""
    root = tmp_path_factory.mktemp("after")
    run = root / "run"
    result = invoke("train", "--offline", "--quiet", "--max-steps", "6", "--save-every", "2", "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    paths = [json.loads(line)["weights_path"] for line in (run / "checkpoints.jsonl").read_text().splitlines()]
    found: dict[str, Path] = {"run": run, "root": root}
    for step in STEPS:
        weights = next(p for p in paths if p.endswith(f"step-{step:06d}-weights"))
        output = root / f"step{step}.jsonl"
        result = invoke("eval", "--offline", "--quiet", "--offline-home", str(run / "twin"), "--model-path", weights,
                        "--output", str(output), "--judge", "twin", "--judge-cache", str(root / "judge.jsonl"))
        assert result.exit_code == 0, result.output
        found[f"step{step}"] = output
    return found


def trajectories(path: Path) -> dict[tuple[str, str], dict]:
    return {(r["data_source"], r["id"]): r for r in read_eval_records(path) if r.get("type") == "trajectory"}


# --- compare -------------------------------------------------------------------------------------


def test_compare_of_two_checkpoints_matches_the_records_and_an_exact_binomial(trained):
    result = invoke("compare", str(trained["step2"]), str(trained["step6"]), "--json",
                    "--plot", str(trained["root"] / "compare.png"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    a, b = trajectories(trained["step2"]), trajectories(trained["step6"])
    assert set(a) == set(b) and data["paired_questions"] == len(a)
    sources = sorted({s for s, _ in a})
    for name, field in (("em", "exact_match"), ("f1", "f1"), ("cover_em", "cover_em")):
        per_source = [sum(float(b[k][field]) - float(a[k][field]) for k in a if k[0] == s)
                      / sum(1 for k in a if k[0] == s) for s in sources]
        assert data["macro"][name]["difference"] == pytest.approx(sum(per_source) / len(sources), abs=1e-12)
    better = sum(1 for k in a if b[k]["exact_match"] and not a[k]["exact_match"])
    worse = sum(1 for k in a if a[k]["exact_match"] and not b[k]["exact_match"])
    assert better + worse > 0  # the run learned something between the two checkpoints
    n = better + worse
    exact = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2 ** n)
    assert data["p_value"]["em"] == pytest.approx(exact, rel=1e-12)
    assert "judge" in data["macro"]
    assert (trained["root"] / "compare.png").stat().st_size > 0
    shown = invoke("show", str(trained["step6"]), "--id", data["flipped"]["em"]["better_in_b"][0]["id"])
    assert shown.exit_code == 0 and "judge" in shown.output


def test_compare_refuses_another_question_set_in_one_line(trained, tmp_path):
    other = tmp_path / "other.jsonl"
    lines = trained["step6"].read_text().splitlines()
    summary = json.loads(lines[-1])
    summary["config"]["dataset_sha256"] = "0" * 64
    other.write_text("\n".join([*lines[:-1], json.dumps(summary)]) + "\n")
    result = invoke("compare", str(trained["step2"]), str(other))
    assert result.exit_code == 2 and "dataset_sha256" in result.output
    assert len(result.output.strip().splitlines()) == 1


# --- eval --judge twin, plot eval ------------------------------------------------------------------


def test_eval_judge_twin_reports_judge_metrics_and_every_record_has_its_judgement(trained):
    summary = load_summary(trained["step6"])
    metrics = summary["metrics"]
    for key in ("judge/macro", "judge/macro_ci95_low", "judge/macro_ci95_high", "judge/micro"):
        assert key in metrics
    assert summary["config"]["judge"] == {"model": "twin", "prompt_version": 1}
    assert summary["card"]["metrics"]["judge"]["model"] == "twin"
    records = trajectories(trained["step6"]).values()
    assert all(r["judge"]["model"] == "twin" for r in records)
    sources = {r["data_source"] for r in records}
    assert all(f"judge/{s}" in metrics for s in sources)


def test_a_rerun_asks_the_judge_nothing_new(trained, tmp_path):
    cache = trained["root"] / "judge.jsonl"
    before = cache.read_text()
    output = tmp_path / "again.jsonl"
    weights = load_summary(trained["step6"])["config"]["model_path"]
    result = invoke("eval", "--offline", "--quiet", "--offline-home", str(trained["run"] / "twin"), "--model-path",
                    weights, "--output", str(output), "--judge", "twin", "--judge-cache", str(cache))
    assert result.exit_code == 0, result.output
    assert cache.read_text() == before
    assert all(r["judge"]["cached"] for r in trajectories(output).values() if r["judge"]["asked"])


def test_plot_eval_draws_several_evals_side_by_side(trained, tmp_path):
    result = invoke("plot", "eval", str(trained["step2"]), str(trained["step6"]), str(trained["step6"]),
                    "-o", str(tmp_path / "evals.png"), "--metric", "judge")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "evals.png").stat().st_size > 0


# --- export -------------------------------------------------------------------------------------


def test_export_a_run_writes_a_checked_adapter_a_model_card_and_the_serve_commands(trained, tmp_path):
    out = tmp_path / "exported"
    result = invoke("export", str(trained["run"]), "--out", str(out), "--eval", str(trained["step6"]))
    assert result.exit_code == 0, result.output
    config = json.loads((out / "adapter_config.json").read_text())
    run_config = json.loads((trained["run"] / "config.json").read_text())
    assert config["r"] == run_config["lora_rank"] and config["base_model_name_or_path"] == run_config["base_model"]
    from safetensors import safe_open

    with safe_open(str(out / "adapter_model.safetensors"), framework="numpy") as weights:
        assert weights.metadata()["stand_in"] == "true"
        ranks = {k: weights.get_slice(k).get_shape()[0 if ".lora_A." in k else 1] for k in weights.keys()}
    assert {r for k, r in ranks.items() if ".in_proj_qkv." not in k} == {config["r"]}
    assert {r for k, r in ranks.items() if ".in_proj_qkv." in k} == {config["rank_pattern"]["in_proj_qkv"]}
    assert any(k.startswith("base_model.model.lm_head.") for k in ranks)  # the run trained the unembedding
    card = (out / "README.md").read_text()
    import yaml

    assert card.startswith("---\n")
    metadata = yaml.safe_load(card.split("\n---\n", 1)[0].removeprefix("---\n"))
    assert metadata["base_model"] == run_config["base_model"] and metadata["library_name"] == "peft"
    step6 = load_summary(trained["step6"])["metrics"]
    (scores,) = metadata["model-index"][0]["results"]
    assert {m["type"]: m["value"] for m in scores["metrics"]} == pytest.approx(
        {"exact_match": step6["em/macro"], "f1": step6["f1/macro"], "cover_em": step6["cover_em/macro"]}, abs=1e-4)
    assert "step6.jsonl" in card and "Offline twin export" in card
    upload = f"hf upload your-hf-name/exported {out} ."
    assert f"```sh\n{upload}\n```" in card and f"  {upload}" in result.output
    assert "PeftModel.from_pretrained" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]


def test_export_from_a_downloaded_archive_needs_no_service_and_keeps_its_readme(trained, tmp_path):
    from searchr1.twin.archive import adapter_files, tar_bytes
    from searchr1.twin.store import CheckpointStore

    weights = json.loads((trained["run"] / "checkpoints.jsonl").read_text().splitlines()[-1])["weights_path"]
    files = adapter_files(CheckpointStore(trained["run"] / "twin").load(weights))
    archive = tmp_path / "weights.tar"
    archive.write_bytes(tar_bytes({**files, "README.md": b"# Tinker LoRA Adapter\n\nfrom the archive\n"}))
    out = tmp_path / "exported"
    result = invoke("export", "--from-archive", str(archive), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "from the archive" in (out / "README.md").read_text() and archive.is_file()
    assert not (out / "checkpoint_complete").exists()


def test_export_resumes_an_interrupted_download(trained, tmp_path):
    from searchr1.twin.archive import checkpoint_archive
    from searchr1.twin.store import CheckpointStore

    weights = json.loads((trained["run"] / "checkpoints.jsonl").read_text().splitlines()[-1])["weights_path"]
    whole = checkpoint_archive(CheckpointStore(trained["run"] / "twin").load(weights))
    out = tmp_path / "exported"
    partial = out / ".download" / f"{weights.rsplit('/', 1)[-1]}.tar"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(whole[:5000])
    result = invoke("export", str(trained["run"]), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"{len(whole)} bytes, resumed after 5000 bytes" in result.output
    assert (out / "adapter_config.json").is_file()


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
                archive.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("members, refused", [
    ((("file", "../escaped.txt", b"x"),), "leaves the output folder"),
    ((("file", "/tmp/absolute-escape.txt", b"x"),), "leaves the output folder"),
    ((("sym", "adapter_model.safetensors", "/etc/passwd"),), "outside the output folder"),
    ((("file", "huge.bin", bytes(3000)),), "over the cap of 2000"),
])
def test_export_refuses_a_hostile_archive_member_by_member(trained, tmp_path, monkeypatch, members, refused):
    import searchr1.twin.archive as archive

    monkeypatch.setattr(archive, "checkpoint_archive", lambda checkpoint: _tar(("file", "ok.txt", b"ok"), *members))
    out = tmp_path / "exported"
    result = invoke("export", str(trained["run"]), "--out", str(out), "--max-bytes", "2000")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("refused: ")]
    assert len(lines) == 1 and refused in lines[0]
    assert "nothing extracted" in result.output and "Traceback" not in result.output
    assert not (out / "ok.txt").exists() and not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/absolute-escape.txt").exists()


def test_export_of_something_else_lists_what_it_holds(trained, tmp_path, monkeypatch):
    import searchr1.twin.archive as archive

    monkeypatch.setattr(archive, "checkpoint_archive", lambda checkpoint: _tar(("file", "weights.bin", b"1234")))
    result = invoke("export", str(trained["run"]), "--out", str(tmp_path / "x"))
    assert result.exit_code == 0, result.output
    assert "not a LoRA adapter" in result.output and re.search(r"file\s+4\s+weights\.bin", result.output)


def test_export_refuses_an_adapter_of_another_rank(trained, tmp_path, monkeypatch):
    import searchr1.twin.archive as archive

    real = archive.adapter_files

    def other_rank(checkpoint):
        files = real(checkpoint)
        config = json.loads(files["adapter_config.json"])
        files["adapter_config.json"] = json.dumps({**config, "r": config["r"] * 2}).encode()
        return archive.tar_bytes(files)

    monkeypatch.setattr(archive, "checkpoint_archive", other_rank)
    result = invoke("export", str(trained["run"]), "--out", str(tmp_path / "x"))
    assert result.exit_code == 1 and "the run trained LoRA rank" in result.output


# --- ask, the card ------------------------------------------------------------------------------


def test_ask_prints_each_turn_and_the_reward(trained):
    result = invoke("ask", "Who is the father of the director of film Jurassic Park?", "--offline",
                    "--checkpoint", str(trained["run"]), "--answer", "Arnold Spielberg")
    assert result.exit_code == 0, result.output
    assert "assistant 1" in result.output and "search: " in result.output
    assert "answered by the offline twin's learning policy" in result.output
    assert re.search(r"reward [+-]\d\.\d\s+EM (yes|no)", result.output)


def test_ask_an_unknown_question_offline_is_one_error_line(trained):
    result = invoke("ask", "What is love?", "--offline")
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()  # up front: no sampler error, no second copy
    assert "not 'What is love?'" in line and "searchr1/offline/questions.json" in line


def test_the_protocol_output_and_summary_carry_the_card(tmp_path):
    output = tmp_path / "protocol.jsonl"
    result = invoke("eval", "--offline", "--quiet", "--protocol", "search-r1", "--backend", "local",
                    "--output", str(output))
    assert result.exit_code == 0, result.output
    card = load_summary(output)["card"]
    assert card["top_k"] == 3 and card["decoding"]["temperature"] == 0.0
    assert card["budgets"]["max_search_calls"] == 4
    assert "card:" in result.output and "corpus" in result.output and "intervals" in result.output
    assert result.output.count("card: wiki-18") >= 1  # each published row's own card


def test_the_twin_serves_archives_only_to_a_signed_url_and_only_sampler_weights(trained, tokenizer):
    import httpx

    from searchr1.twin import start_twin

    lines = (trained["run"] / "checkpoints.jsonl").read_text().splitlines()
    weights, state = json.loads(lines[-1])["weights_path"], json.loads(lines[-1])["state_path"]
    with start_twin(home=trained["run"] / "twin", tokenizer=tokenizer, policy="learning") as twin:
        headers = {"X-API-Key": twin.api_key}
        cid = weights.removeprefix("trio://twin/")
        url = f"{twin.base_url}/api/openapi/v1/checkpoints/{cid}/download-url"
        signed = httpx.get(url, headers=headers).json()["url"]
        assert httpx.get(signed).status_code == 200
        assert httpx.get(signed.split("?")[0] + "?sig=0").status_code == 403
        assert httpx.get(url).status_code in (401, 403)  # no key
        ranged = httpx.get(signed, headers={"Range": "bytes=10-"})
        assert ranged.status_code == 206 and ranged.headers["Content-Range"].startswith("bytes 10-")
        state_url = f"{twin.base_url}/api/openapi/v1/checkpoints/{state.removeprefix('trio://twin/')}/download-url"
        assert httpx.get(state_url, headers=headers).status_code == 400

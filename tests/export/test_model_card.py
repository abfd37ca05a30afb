"""The exported model card: Hugging Face metadata that ``huggingface_hub`` reads back (base model,
PEFT, pipeline, the base model's license, eval results as ``model-index``), each fact of the run
said once, and an upload command whose repository id the Hub accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.export.adapter import Adapter
from searchr1.export.card import (BASE_MODEL_LICENSES, EVAL_FIGURES, PIPELINE_TAG, front_matter, model_card, repo_name,
                                  upload_command)

huggingface_hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub (transformers' dependency) reads "
                                                                "the card; not installed")

BASE = "Qwen/Qwen3.5-4B"
RUN = {"run_name": "nq-run", "offline": False, "learning_rate": 1e-5, "questions_per_batch": 8, "reward": "em",
       "loss_fn": "importance_sampling", "advantage_mode": "mean", "search": {"backend": "zhihu"},
       "rollout": {"group_size": 5, "max_search_calls": 4, "max_assistant_turns": 6}}


def summary(em: float, f1: float, cover: float, questions: int = 120, data: str = "datasets/dev.jsonl") -> dict:
    metrics = {}
    for key, value in (("em/macro", em), ("f1/macro", f1), ("cover_em/macro", cover)):
        metrics |= {key: value, key + "_ci95_low": value / 2, key + "_ci95_high": (1 + value) / 2}
    return {"evaluated_examples": questions, "metrics": metrics, "config": {"dataset": data}}


def card_of(base: str = BASE, *, evals=(), run=RUN, stand_in: str | None = None, folder: Path = Path("exported/x")):
    adapter = Adapter(folder, {"r": 32, "lora_alpha": 32, "base_model_name_or_path": base,
                               "target_modules": ["q_proj", "v_proj"]}, {"a": (32, 8), "b": (8, 32)})
    return model_card(adapter, name=repo_name(folder), checkpoint="trio://x/weights/step-000010", run_config=run,
                      step=10, evals=list(evals), commands=["python -c pass"], upload=upload_command(folder, merged=False),
                      shape_source="the shipped config", stand_in_note=stand_in, archive_readme=None)


def test_huggingface_hub_reads_the_metadata_and_each_eval_files_figures(tmp_path):
    evals = [("eval_result/dev.jsonl", summary(0.41, 0.5, 0.47)),
             ("eval_result/test.jsonl", summary(0.43, 0.52, 0.5, questions=500, data="datasets/test.jsonl"))]
    text = card_of(evals=evals)
    (tmp_path / "README.md").write_text(text, "utf-8")
    card = huggingface_hub.ModelCard(text)
    data = card.data.to_dict()
    assert data["base_model"] == BASE and data["library_name"] == "peft"
    assert data["pipeline_tag"] == PIPELINE_TAG == "text-generation" and data["license"] == "apache-2.0"
    assert f"base_model:adapter:{BASE}" in data["tags"]
    assert huggingface_hub.metadata_load(tmp_path / "README.md") == data  # the same read from the file
    read = [(result.dataset_name, result.metric_type, result.metric_value) for result in card.data.eval_results]
    expected = [(path, kind, summary_["metrics"][key]) for path, summary_ in evals for key, kind, _ in EVAL_FIGURES]
    assert [(kind, value) for _, kind, value in read] == [(kind, pytest.approx(value, abs=1e-4))
                                                          for _, kind, value in expected]
    assert all(Path(path).name in name for (name, _, _), (path, _, _) in zip(read, expected, strict=True))
    assert {result.task_type for result in card.data.eval_results} == {"question-answering"}


def test_a_second_eval_file_on_the_same_dataset_is_in_the_table_but_not_a_second_result():
    evals = [("first.jsonl", summary(0.41, 0.5, 0.47)), ("again.jsonl", summary(0.4, 0.49, 0.46))]
    text = card_of(evals=evals)
    read = huggingface_hub.ModelCard(text).data.eval_results
    assert [(result.metric_type, result.metric_value) for result in read] == [
        (kind, evals[0][1]["metrics"][key]) for key, kind, _ in EVAL_FIGURES]
    assert "| `first.jsonl` | 120 |" in text and "| `again.jsonl` | 120 |" in text


def test_without_an_eval_file_there_is_no_model_index_and_an_unknown_base_has_no_license():
    assert "eval_results" not in huggingface_hub.ModelCard(card_of()).data.to_dict()
    other = "Qwen/Qwen3.5-9B"
    assert other not in BASE_MODEL_LICENSES
    data = huggingface_hub.ModelCard(card_of(other)).data.to_dict()
    assert "license" not in data and data["base_model"] == other


def test_an_offline_cards_results_say_the_twins_policy_answered():
    evals = [("step6.jsonl", summary(1.0, 1.0, 1.0, questions=14))]
    card = huggingface_hub.ModelCard(card_of(evals=evals, run={**RUN, "offline": True}))
    assert {result.task_name for result in card.data.eval_results} == {
        "Question answering with search (offline twin: its policy answered, not a language model)"}


def test_each_setting_of_the_run_is_said_once():
    text = card_of()
    run_section = text.split("## Training run", 1)[1].split("##", 1)[0]
    assert run_section.count("reward em") == 1 and run_section.count("group size 5") == 1


def test_the_front_matter_is_the_first_block_and_names_the_license_source():
    lines = front_matter(BASE)
    assert lines[0] == "---" and lines[lines.index("---", 1)] == "---"
    license_line = lines.index("license: apache-2.0")
    assert lines[license_line - 1].startswith("# ") and BASE in lines[license_line - 1]


@given(st.text(min_size=1, max_size=60).filter(lambda name: name not in (".", "..") and "/" not in name
                                               and "\x00" not in name))
def test_the_upload_command_names_a_repository_id_the_hub_accepts_whatever_the_folder_is_called(name):
    words = shlex.split(upload_command(Path("exported") / name, merged=True))
    assert words[:2] == ["hf", "upload"] and words[3:5] == [str(Path("exported") / name), "."]
    huggingface_hub.utils.validate_repo_id(words[2])
    assert words[5:] == ["--exclude", "merged/*"]

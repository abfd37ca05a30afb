"""The model card written beside an exported adapter (``README.md``): Hugging Face metadata in its
front matter (the base model, PEFT, the task, the license, eval results as ``model-index``), then
the adapter, the run that trained it, its evaluations, and the commands that load and upload it.

The metadata follows the Hub's model-card specification; ``huggingface_hub.ModelCard`` reads it
back in ``tests/export/test_card.py``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
import yaml

from searchr1.basics.json_types import as_object
from searchr1.export.adapter import Adapter

CARD_FILE = "README.md"
PIPELINE_TAG = "text-generation"  # the adapter's model answers in text, calling a search tool
TASK_TYPE = "question-answering"  # what the eval results measure

# An adapter is a derivative of its base model and carries its license. Each entry is the base
# model's own: the `license:` of its model card on the Hugging Face Hub (Qwen/Qwen3.5-4B: apache-2.0,
# with the Apache 2.0 LICENSE file in that repository). A base model not listed gets no license line.
BASE_MODEL_LICENSES: Mapping[str, str] = {"Qwen/Qwen3.5-4B": "apache-2.0"}

# The eval summary's figures the card reports: (metrics key, model-index metric type, name shown).
EVAL_FIGURES = (("em/macro", "exact_match", "macro EM"), ("f1/macro", "f1", "macro F1"),
                ("cover_em/macro", "cover_em", "macro cover EM"))


REPO_NAME_LENGTH = 96  # the Hub's longest repository name


def repo_name(folder: Path) -> str:
    """A Hub repository name for ``folder``: its name, with each run of what a repository name
    cannot hold (other characters, ``--``, ``..``) made one ``-``, starting and ending with a letter
    or digit, at most 96 characters, not ending in ``.git``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", folder.resolve().name)
    name = re.sub(r"[-.]{2,}", "-", name)[:REPO_NAME_LENGTH].strip("-._")
    name = name.removesuffix(".git").strip("-._")
    return name or "searchr1-adapter"


def upload_command(folder: Path, *, merged: bool) -> str:
    """The command that uploads ``folder`` to a Hugging Face model repository (``hf``, the CLI of
    ``huggingface_hub``; the user's Hub name goes in place of ``your-hf-name``). Merged weights,
    a model of their own, are left out of the adapter's repository."""
    command = f"hf upload your-hf-name/{repo_name(folder)} {shlex.quote(str(folder))} ."
    return command + (" --exclude 'merged/*'" if merged else "")


def model_index(name: str, evals: Sequence[tuple[str, Mapping[str, object]]], *,
                offline: bool) -> list[dict[str, object]]:
    """The ``model-index`` metadata of the eval files: one result per dataset (the Hub keys results
    by task and dataset), from the first file of ``evals`` on it, with the figures of
    :data:`EVAL_FIGURES` it holds; empty when no file holds any. Offline, the twin's policy
    answered, and the task's name says so."""
    task = "Question answering with search" + (" (offline twin: its policy answered, not a language model)"
                                               if offline else "")
    results: list[dict[str, object]] = []
    seen = set()
    for path, summary in evals:
        figures = as_object(summary.get("metrics") or {}, "metrics")
        metrics = [{"type": kind, "name": shown, "value": round(float(value), 4)}
                   for key, kind, shown in EVAL_FIGURES if isinstance(value := figures.get(key), (int, float))]
        data = Path(str(as_object(summary.get("config") or {}, "config").get("dataset") or path))
        if not metrics or data in seen:
            continue
        seen.add(data)
        results.append({"task": {"type": TASK_TYPE, "name": task},
                        "dataset": {"type": f"{data.parent.name}/{data.stem}" if data.parent.name else data.stem,
                                    "name": f"{data.name} ({summary.get('evaluated_examples')} questions, "
                                            f"eval file {Path(path).name})"},
                        "metrics": metrics})
    return [{"name": name, "results": results}] if results else []


def front_matter(base_model: str, *, index: Sequence[Mapping[str, object]] = ()) -> list[str]:
    """Hugging Face model-card metadata: the base model, PEFT as the library, the pipeline, the base
    model's license (:data:`BASE_MODEL_LICENSES`), the tags the Hub uses to link an adapter to its
    base, and the eval results (``index``, :func:`model_index`'s)."""
    metadata: dict[str, object] = {"base_model": base_model, "library_name": "peft", "pipeline_tag": PIPELINE_TAG}
    lines = ["---", *_yaml_lines(metadata)]
    license_name = BASE_MODEL_LICENSES.get(base_model)
    if license_name is not None:
        lines += [f"# the license of the base model, from the license field of {base_model}'s model card",
                  *_yaml_lines({"license": license_name})]
    lines += _yaml_lines({"tags": ["searchr1", "search-r1", "peft", "lora", f"base_model:adapter:{base_model}"]})
    if index:
        lines += _yaml_lines({"model-index": [dict(entry) for entry in index]})
    return [*lines, "---", ""]


def _yaml_lines(data: Mapping[str, object]) -> list[str]:
    return yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True, width=1000).splitlines()


def model_card(adapter: Adapter, *, name: str, checkpoint: str, run_config: Mapping[str, object] | None,
               step: int | None, evals: Sequence[tuple[str, Mapping[str, object]]], commands: Sequence[str],
               upload: str, shape_source: str, stand_in_note: str | None, archive_readme: str | None) -> str:
    """The README.md written beside the adapter; an archive's own README is kept below it."""
    offline = stand_in_note is not None or bool((run_config or {}).get("offline"))
    lines = [*front_matter(adapter.base_model, index=model_index(name, evals, offline=offline)),
             f"# Search-R1 LoRA adapter for {adapter.base_model}", ""]
    if stand_in_note:
        lines += [f"> **Offline twin export.** {stand_in_note}. It has the structure of a Qwen3.5 adapter at a "
                  "tiny size; it is not a model to serve.", ""]
    rank_pattern = as_object(adapter.config.get("rank_pattern") or {}, "rank_pattern")
    ranks = ", ".join(f"{k}: {v}" for k, v in rank_pattern.items())
    lines += ["| | |", "|---|---|", f"| base model | `{adapter.base_model}` |",
              f"| LoRA rank | {adapter.rank}{f' ({ranks})' if ranks else ''} |",
              f"| LoRA alpha | {adapter.config.get('lora_alpha')} |",
              f"| target modules | {', '.join(adapter.target_modules)} |",
              f"| checkpoint | `{checkpoint}` |", f"| training steps | {step if step is not None else 'unknown'} |",
              f"| tensors | {len(adapter.shapes)} (shapes checked against {shape_source}) |", ""]
    if run_config:
        from searchr1.run.algorithm import algorithm_of, describe_algorithm

        rollout = run_config.get("rollout")
        rollout = rollout if isinstance(rollout, Mapping) else {}
        lines += ["## Training run", "",
                  f"- run `{run_config.get('run_name')}` "
                  f"({'offline twin' if run_config.get('offline') else 'live PyTRIO'})",
                  f"- algorithm: {describe_algorithm(algorithm_of(dict(run_config)))}",  # names the reward
                  f"- learning rate {run_config.get('learning_rate')}, {run_config.get('questions_per_batch')} "
                  f"questions per batch, group size {rollout.get('group_size')}",
                  f"- search backend {as_object(run_config.get('search') or {}, 'search').get('backend')}, at most "
                  f"{rollout.get('max_search_calls')} searches and {rollout.get('max_assistant_turns')} turns", ""]
    if evals:
        lines += ["## Evaluation", "", "| eval file | questions | " + " | ".join(s for _, _, s in EVAL_FIGURES) + " |",
                  "|---|---|" + "---|" * len(EVAL_FIGURES)]
        for path, summary in evals:
            m = as_object(summary.get("metrics") or {}, "metrics")
            cells = [f"{m[k]:.3f} [{m[k + '_ci95_low']:.3f}, {m[k + '_ci95_high']:.3f}]" if k in m else "-"
                     for k, _, _ in EVAL_FIGURES]
            lines.append(f"| `{Path(path).name}` | {summary.get('evaluated_examples')} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Use", "", "```sh", *commands, "```", "",
              "## Upload", "", "To a model repository on the Hugging Face Hub (`hf` comes with `huggingface_hub`; "
              "log in first with `hf auth login`):", "", "```sh", upload, "```", ""]
    if archive_readme:
        lines += ["## The archive's README", "", archive_readme.rstrip(), ""]
    return "\n".join(lines)

"""A PEFT LoRA adapter on disk (``adapter_config.json`` + ``adapter_model.safetensors``): find
it, check it, describe it in a model card, and say how to serve and load it.

Checks (each failure one line): the config is PEFT's LoRA config (``peft_type`` LORA, a
positive rank ``r``, target modules, a base model); the rank and base model are the training
run's; every tensor is a ``lora_A`` (``r x in``) or ``lora_B`` (``out x r``) of a target module,
each A has its B; and ``in``/``out`` match the base model's projections where those are known:
from the stand-in dimensions an offline twin's archive declares in its metadata, or from the
base model's ``config.json`` when transformers finds it in the local cache.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CARD_FILE = "README.md"
TENSOR_PATTERN = re.compile(r"(?:^|\.)(?P<module>[A-Za-z0-9_]+)\.lora_(?P<part>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")


@dataclass
class Adapter:
    folder: Path
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    metadata: dict[str, str]
    problems: list[str] = field(default_factory=list)
    shape_source: str = "no base model dimensions known: shapes checked against the rank only"

    @property
    def rank(self) -> Any:
        return self.config.get("r")

    @property
    def base_model(self) -> Any:
        return self.config.get("base_model_name_or_path")

    @property
    def target_modules(self) -> list[str]:
        modules = self.config.get("target_modules")
        return [modules] if isinstance(modules, str) else list(modules or [])

    @property
    def stand_in(self) -> bool:
        return self.metadata.get("stand_in") == "true"


def find_adapter(folder: Path) -> Path | None:
    """The folder (``folder`` itself or one below it) holding both adapter files, if any."""
    for candidate in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
        if (candidate / CONFIG_FILE).is_file() and (candidate / WEIGHTS_FILE).is_file():
            return candidate
    return None


def base_model_dims(base_model: str) -> dict[str, int] | None:
    """Projection dimensions of the base model from its locally cached config, if any."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(base_model, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, not a model name, no network: unknown
        return None
    config = getattr(config, "text_config", None) or config
    try:
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return {"hidden_size": int(config.hidden_size), "intermediate_size": int(config.intermediate_size),
                "kv_size": kv_heads * head_dim, "q_size": heads * head_dim}
    except (AttributeError, TypeError, ValueError):
        return None


def _expected_shapes(dims: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    hidden, inter, kv = dims["hidden_size"], dims["intermediate_size"], dims["kv_size"]
    q = dims.get("q_size", hidden)
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def load_adapter(folder: Path, *, expected_rank: int | None = None, expected_base: str | None = None) -> Adapter:
    """Read and check the adapter in ``folder``; ``problems`` lists what is wrong."""
    from safetensors import SafetensorError, safe_open

    problems: list[str] = []
    try:
        config = json.loads((folder / CONFIG_FILE).read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return Adapter(folder, {}, {}, {}, [f"{CONFIG_FILE}: not JSON ({error})"])
    if not isinstance(config, dict):
        return Adapter(folder, {}, {}, {}, [f"{CONFIG_FILE}: not a JSON object"])
    shapes: dict[str, tuple[int, ...]] = {}
    metadata: dict[str, str] = {}
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="numpy") as weights:
            metadata = dict(weights.metadata() or {})
            for name in weights.keys():
                shapes[name] = tuple(weights.get_slice(name).get_shape())
    except (SafetensorError, OSError, ValueError) as error:
        problems.append(f"{WEIGHTS_FILE}: not a readable safetensors file ({error})")
    adapter = Adapter(folder, config, shapes, metadata, problems)
    if str(config.get("peft_type", "")).upper() != "LORA":
        problems.append(f"{CONFIG_FILE}: peft_type {config.get('peft_type')!r}, not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        problems.append(f"{CONFIG_FILE}: r {rank!r} is not a positive whole number")
        rank = None
    if not adapter.target_modules:
        problems.append(f"{CONFIG_FILE}: no target_modules")
    if not isinstance(adapter.base_model, str) or not adapter.base_model:
        problems.append(f"{CONFIG_FILE}: no base_model_name_or_path")
    if expected_rank is not None and rank is not None and rank != expected_rank:
        problems.append(f"{CONFIG_FILE}: r {rank}, but the run trained LoRA rank {expected_rank}")
    if expected_base and isinstance(adapter.base_model, str) and adapter.base_model != expected_base:
        problems.append(f"{CONFIG_FILE}: base model {adapter.base_model!r}, but the run trained {expected_base!r}")
    dims: dict[str, int] | None = None
    if adapter.stand_in:
        try:
            dims = {k: int(metadata[k]) for k in ("hidden_size", "intermediate_size", "kv_size")}
            adapter.shape_source = "the stand-in dimensions in the archive's metadata (offline twin)"
        except (KeyError, ValueError):
            problems.append(f"{WEIGHTS_FILE}: stand-in metadata without its dimensions")
    elif isinstance(adapter.base_model, str):
        dims = base_model_dims(adapter.base_model)
        if dims is not None:
            adapter.shape_source = f"{adapter.base_model}'s config.json"
    problems.extend(_tensor_problems(shapes, adapter.target_modules, rank, dims))
    return adapter


def _tensor_problems(shapes: Mapping[str, tuple[int, ...]], modules: Sequence[str], rank: int | None,
                     dims: Mapping[str, int] | None) -> list[str]:
    problems: list[str] = []
    expected = _expected_shapes(dims) if dims else {}
    pairs: dict[str, set[str]] = {}
    if not shapes:
        return [f"{WEIGHTS_FILE}: no tensors"]
    for name, shape in sorted(shapes.items()):
        match = TENSOR_PATTERN.search(name)
        if match is None:
            problems.append(f"tensor {name}: not a lora_A or lora_B weight")
            continue
        module, part = match["module"], match["part"]
        pairs.setdefault(name[: match.start("part") - len("lora_")], set()).add(part)
        if module not in modules:
            problems.append(f"tensor {name}: module {module} is not among the target modules")
        if len(shape) != 2:
            problems.append(f"tensor {name}: shape {shape}, not a matrix")
            continue
        if rank is not None and shape[0 if part == "A" else 1] != rank:
            problems.append(f"tensor {name}: shape {shape} does not have the rank {rank} "
                            f"{'rows' if part == 'A' else 'columns'}")
        if module in expected:
            fan_in, fan_out = expected[module]
            want = fan_in if part == "A" else fan_out
            got = shape[1] if part == "A" else shape[0]
            if got != want:
                problems.append(f"tensor {name}: {'in' if part == 'A' else 'out'} features {got}, "
                                f"the base model's {module} has {want}")
    for prefix, parts in sorted(pairs.items()):
        if parts != {"A", "B"}:
            problems.append(f"tensors {prefix}*: lora_{'B' if 'A' in parts else 'A'} is missing")
    return problems


# --- what to print and write -----------------------------------------------------------------


def serve_commands(folder: Path, adapter: Adapter, name: str = "searchr1") -> list[str]:
    where = shlex.quote(str(folder))
    base = shlex.quote(str(adapter.base_model))
    return [
        f"vllm serve {base} --enable-lora --max-lora-rank {adapter.rank} --lora-modules {name}={where}",
        (f"python -c \"from transformers import AutoModelForCausalLM; from peft import PeftModel; "
         f"model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('{adapter.base_model}'), "
         f"'{folder}')\""),
    ]


def model_card(adapter: Adapter, *, checkpoint: str, run_config: Mapping[str, Any] | None, step: int | None,
               evals: Sequence[tuple[str, Mapping[str, Any]]], commands: Sequence[str]) -> str:
    """The README.md written beside the adapter."""
    lines = [f"# Search-R1 LoRA adapter for {adapter.base_model}", ""]
    if adapter.stand_in:
        lines += [f"> **Offline twin export.** {adapter.metadata.get('note', '')}. It shows the shape of the "
                  "export path; it is not a model to serve.", ""]
    lines += ["| | |", "|---|---|", f"| base model | `{adapter.base_model}` |", f"| LoRA rank | {adapter.rank} |",
              f"| LoRA alpha | {adapter.config.get('lora_alpha')} |",
              f"| target modules | {', '.join(adapter.target_modules)} |",
              f"| checkpoint | `{checkpoint}` |", f"| training steps | {step if step is not None else 'unknown'} |",
              f"| tensors | {len(adapter.shapes)} (shapes checked against {adapter.shape_source}) |", ""]
    if run_config:
        from searchr1.run.algorithm import algorithm_of, describe_algorithm

        rollout = run_config.get("rollout") if isinstance(run_config.get("rollout"), Mapping) else {}
        lines += ["## Training run", "",
                  f"- run `{run_config.get('run_name')}` ({'offline twin' if run_config.get('offline') else 'live PyTRIO'})",
                  f"- algorithm: {describe_algorithm(algorithm_of(dict(run_config)))}",
                  f"- learning rate {run_config.get('learning_rate')}, {run_config.get('questions_per_batch')} "
                  f"questions per batch, group size {rollout.get('group_size')}, reward {run_config.get('reward')}",
                  f"- search backend {(run_config.get('search') or {}).get('backend')}, at most "
                  f"{rollout.get('max_search_calls')} searches and {rollout.get('max_assistant_turns')} turns", ""]
    if evals:
        lines += ["## Evaluation", "", "| eval file | questions | macro EM | macro F1 | macro cover EM |",
                  "|---|---|---|---|---|"]
        for path, summary in evals:
            m = summary.get("metrics") or {}
            cells = [f"{m[k]:.3f} [{m[k + '_ci95_low']:.3f}, {m[k + '_ci95_high']:.3f}]" if k in m else "-"
                     for k in ("em/macro", "f1/macro", "cover_em/macro")]
            lines.append(f"| `{Path(path).name}` | {summary.get('evaluated_examples')} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Use", "", "```sh", *commands, "```", ""]
    return "\n".join(lines)

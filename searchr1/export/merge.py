"""Merge a converted LoRA adapter into a local copy of its base model: full weights that any
loader of the base model reads, with no PEFT at serving time.

Each module's weight becomes ``W + B @ A * lora_alpha / r``, computed in float32 and stored in the
weight's own dtype (the fused ``in_proj_qkv`` has rank ``3r`` and alpha ``3 x lora_alpha``, the
same ratio). The base is read one safetensors file at a time (``model.safetensors`` or the shards
its index names), so memory holds one shard. An unembedding LoRA on a model with tied embeddings
(Qwen3.5-4B) changes only the output projection, as in training: the merged model gets its own
``lm_head.weight`` (the embedding plus the delta) and ``tie_word_embeddings`` false, and the
input embeddings stay the base's. Every delta must land on a weight of the base, or nothing is
written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from searchr1.export.convert import ConversionError, Converted

TEXT_PREFIXES = ("model.language_model.", "model.")
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class MergeReport:
    folder: Path
    merged: int
    untied: bool


def _deltas(converted: Converted) -> dict[str, np.ndarray]:
    """``text-model path -> delta (out, in)`` in float32."""
    scale = float(converted.config["lora_alpha"]) / float(converted.config["r"])
    deltas: dict[str, np.ndarray] = {}
    for name, a in converted.tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        b = converted.tensors[f"{module}.lora_B.weight"]
        path = module.removeprefix(converted.layout.prefix).removeprefix("base_model.model.")
        deltas[path] = (b.astype(np.float32) @ a.astype(np.float32)) * scale
    return deltas


def _text_path(key: str) -> str | None:
    """The text-model module of a base checkpoint's weight key (``layers.3.mlp.up_proj``), or None."""
    if key == "lm_head.weight":
        return "lm_head"
    for prefix in TEXT_PREFIXES:
        if key.startswith(prefix) and key.endswith(".weight"):
            return key.removeprefix(prefix).removesuffix(".weight")
    return None


def merge_into(base: Path, converted: Converted, out: Path) -> MergeReport:
    """Write ``out`` (a new folder): the base model's files with every delta of ``converted`` added."""
    import ml_dtypes  # noqa: F401 - bfloat16 weights through safetensors.numpy
    from safetensors import safe_open
    from safetensors.numpy import save_file

    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{base}: no *.safetensors weights to merge into")
    deltas = _deltas(converted)
    pending = dict(deltas)
    staging = out.with_name(f".{out.name}.merging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    untied, embed_file = False, None
    all_keys: dict[str, str] = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as weights:
            all_keys |= {key: file.name for key in weights.keys()}
    needs_head = "lm_head" in deltas and "lm_head.weight" not in all_keys
    for file in files:
        tensors: dict[str, np.ndarray] = {}
        with safe_open(str(file), framework="numpy") as weights:
            metadata = weights.metadata() or {"format": "pt"}
            for key in weights.keys():
                weight = weights.get_tensor(key)
                path = _text_path(key)
                if path is not None and path in pending:
                    delta = pending.pop(path)
                    if weight.shape != delta.shape:
                        raise ConversionError(f"{file.name}: {key} has shape {weight.shape}, the delta {delta.shape}")
                    weight = (weight.astype(np.float32) + delta).astype(weight.dtype)
                tensors[key] = weight
                if needs_head and path == "embed_tokens":
                    head = weight.astype(np.float32) + pending.pop("lm_head")
                    tensors["lm_head.weight"] = head.astype(weight.dtype)
                    untied, embed_file = True, file.name
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(staging / file.name), metadata=metadata)
    if pending:
        shutil.rmtree(staging, ignore_errors=True)
        raise ConversionError(f"{base}: no weight for the delta of {sorted(pending)[0]} "
                              f"({len(pending)} left unmerged); nothing written")
    for item in sorted(base.iterdir()):
        if item.is_file() and item.suffix != ".safetensors" and item.name != INDEX_FILE:
            shutil.copyfile(item, staging / item.name)
    if (base / INDEX_FILE).is_file():
        index = json.loads((base / INDEX_FILE).read_text("utf-8"))
        if untied:
            index.setdefault("weight_map", {})["lm_head.weight"] = embed_file
        (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", "utf-8")
    if untied:
        config = json.loads((staging / "config.json").read_text("utf-8"))
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return MergeReport(out, len(deltas), untied)

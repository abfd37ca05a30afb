"""The twin's checkpoint download: a sampler checkpoint served as a PEFT LoRA adapter archive.

A tar (uncompressed, fixed member order and times, so the same checkpoint always gives the same
bytes and a resumed download can continue any earlier one) holding::

    adapter_config.json        PEFT's LoRA config: base_model_name_or_path = the run's base
                               model, r = the run's LoRA rank, target_modules from what the run
                               trains (attention and/or MLP projections)
    adapter_model.safetensors  lora_A (r x in) and lora_B (out x r) of every target module of
                               STAND_IN layers, written with ``safetensors.numpy``

The twin's policy is not a language model, so the tensors are small stand-ins (a hidden size of
STAND_IN["hidden_size"], drawn from the checkpoint's own parameters); the safetensors metadata
says so (``stand_in = "true"``) and gives the stand-in dimensions, which is what ``export``
checks the shapes against.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import numpy as np

from searchr1.twin.store import Checkpoint

STAND_IN = {"hidden_size": 16, "intermediate_size": 32, "kv_size": 8, "num_hidden_layers": 2}
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_ALPHA = 32
STAND_IN_NOTE = ("small stand-in tensors from the offline twin, not a trained language model's weights; "
                 "the twin's policy produced every offline answer")


def module_shapes(dims: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``module -> (in_features, out_features)`` of a Qwen-style decoder layer of these dims."""
    hidden, inter, kv = dims["hidden_size"], dims["intermediate_size"], dims["kv_size"]
    return {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def target_modules(train_attn: bool, train_mlp: bool) -> list[str]:
    return [*(ATTENTION_MODULES if train_attn else ()), *(MLP_MODULES if train_mlp else ())] or list(ATTENTION_MODULES)


def tensor_name(layer: int, module: str, part: str) -> str:
    group = "self_attn" if module in ATTENTION_MODULES else "mlp"
    return f"base_model.model.model.layers.{layer}.{group}.{module}.lora_{part}.weight"


def adapter_files(checkpoint: Checkpoint) -> dict[str, bytes]:
    """``file name -> bytes`` of the adapter of ``checkpoint``."""
    from safetensors.numpy import save

    config = checkpoint.config
    modules = target_modules(config.train_attn, config.train_mlp)
    digest = hashlib.sha256(np.ascontiguousarray(checkpoint.params).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    shapes = module_shapes(STAND_IN)
    rank = config.lora_rank
    tensors: dict[str, np.ndarray] = {}
    for layer in range(STAND_IN["num_hidden_layers"]):
        for module in modules:
            fan_in, fan_out = shapes[module]
            tensors[tensor_name(layer, module, "A")] = rng.standard_normal((rank, fan_in)).astype(np.float32) * 0.01
            tensors[tensor_name(layer, module, "B")] = rng.standard_normal((fan_out, rank)).astype(np.float32) * 0.01
    metadata = {"format": "pt", "producer": "searchr1 offline twin", "stand_in": "true", "note": STAND_IN_NOTE,
                "checkpoint": checkpoint.path, **{k: str(v) for k, v in STAND_IN.items()}}
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": config.base_model,
        "r": rank, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none",
        "target_modules": modules, "inference_mode": True,
    }
    return {"adapter_config.json": (json.dumps(adapter_config, indent=2) + "\n").encode(),
            "adapter_model.safetensors": save(tensors, metadata=metadata)}


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A deterministic uncompressed tar of regular files (mode 0644, mtime 0, no owner)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def checkpoint_archive(checkpoint: Checkpoint) -> bytes:
    """The bytes the twin serves for a sampler checkpoint's download."""
    return tar_bytes(adapter_files(checkpoint))

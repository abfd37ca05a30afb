"""The twin's checkpoint download: a sampler checkpoint served as a Tinker-format Qwen3.5 LoRA
archive, shaped like the real one at a scaled-down size.

A tar (uncompressed, fixed member order and times, so the same checkpoint always gives the same
bytes and a resumed download can continue any earlier one) holding what the Tinker CLI's
``checkpoint download`` finds in a real archive::

    adapter_config.json        the raw LoRA config: peft_type, r, lora_alpha, target_modules
                               "all-linear"; no base_model_name_or_path (a real one may lack it)
    adapter_model.safetensors  lora_A (r x in) and lora_B (out x r), named as Tinker trains them
                               (searchr1.export.convert: split in_proj_q/k/v in linear-attention
                               layers, unembed_tokens when the run trains it), in bfloat16
    checkpoint_complete        the marker of a finished upload (empty)

The structure is Qwen3.5's (:mod:`searchr1.export.qwen35`): three linear-attention layers then
one full-attention layer with a gated ``q_proj``, the MLP, the unembedding when
``train_unembed``. The twin's policy is not a language model, so the dimensions are those of
:data:`STAND_IN_CONFIG`, a tiny Qwen3.5 text config, and the values are drawn from the
checkpoint's own parameters. The safetensors metadata says so (``stand_in = "true"``) and carries
that config, which is what ``export`` checks the shapes against; a real archive's metadata holds
only ``format``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import numpy as np

from searchr1.export.qwen35 import LayerType, text_dims
from searchr1.twin.store import Checkpoint

STAND_IN_CONFIG: dict[str, object] = {
    "model_type": "qwen3_5_text", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "linear_num_key_heads": 1,
    "linear_key_head_dim": 8, "linear_num_value_heads": 2, "linear_value_head_dim": 8, "vocab_size": 64,
    "tie_word_embeddings": True,
}
LORA_ALPHA = 32
# What Tinker trains in each kind of layer (the linear-attention gates in_proj_b/in_proj_a are not
# adapted): attention, MLP, and the unembedding, each switched by the run's train_* flags.
FULL_ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
LINEAR_ATTENTION_MODULES = ("in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
STAND_IN_NOTE = ("small stand-in tensors from the offline twin, not a trained language model's weights; "
                 "the twin's policy produced every offline answer")


def trained_shapes(config: dict[str, object], *, train_attn: bool, train_mlp: bool,
                   train_unembed: bool) -> dict[str, tuple[int, int]]:
    """``raw tensor prefix -> (in, out)`` of every module a run with these flags trains, named
    as in a Tinker archive."""
    dims = text_dims(config, "the twin's stand-in config")
    linear = dims.linear_modules()
    split = dict(zip(("in_proj_q", "in_proj_k", "in_proj_v"), (size for _, size in dims.fused_qkv_split())))
    shapes: dict[str, tuple[int, int]] = {}
    for n, kind in enumerate(dims.layer_types):
        if train_attn and kind is LayerType.FULL_ATTENTION:
            for module in FULL_ATTENTION_MODULES:
                shapes[f"layers.{n}.self_attn.{module}"] = linear[f"layers.{n}.self_attn.{module}"]
        if train_attn and kind is LayerType.LINEAR_ATTENTION:
            for module in LINEAR_ATTENTION_MODULES:
                shapes[f"layers.{n}.linear_attn.{module}"] = (
                    (dims.hidden_size,
                     split[module]) if module in split else linear[f"layers.{n}.linear_attn.{module}"])
        if train_mlp:
            for module in MLP_MODULES:
                shapes[f"layers.{n}.mlp.{module}"] = linear[f"layers.{n}.mlp.{module}"]
    if train_unembed:
        shapes["unembed_tokens"] = linear["lm_head"]
    return shapes


def adapter_files(checkpoint: Checkpoint) -> dict[str, bytes]:
    """``file name -> bytes`` of the archive of ``checkpoint``."""
    import ml_dtypes
    from safetensors.numpy import save

    config = checkpoint.config
    digest = hashlib.sha256(np.ascontiguousarray(checkpoint.params).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    rank = config.lora_rank
    shapes = trained_shapes(STAND_IN_CONFIG, train_attn=config.train_attn, train_mlp=config.train_mlp,
                            train_unembed=config.train_unembed)
    tensors: dict[str, np.ndarray] = {}
    for module, (fan_in, fan_out) in shapes.items():
        prefix = f"base_model.model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) * 0.01).astype(ml_dtypes.bfloat16)
        tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * 0.01).astype(ml_dtypes.bfloat16)
    metadata = {"format": "pt", "producer": "searchr1 offline twin", "stand_in": "true", "note": STAND_IN_NOTE,
                "checkpoint": checkpoint.path, "stand_in_config": json.dumps(STAND_IN_CONFIG, sort_keys=True)}
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": LORA_ALPHA, "target_modules": "all-linear",
                      "lora_dropout": 0.0, "use_rslora": False, "use_dora": False}
    return {"adapter_config.json": (json.dumps(adapter_config, indent=2, sort_keys=True) + "\n").encode(),
            "adapter_model.safetensors": save(tensors, metadata=metadata),
            "checkpoint_complete": b""}


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

"""The exported adapter, loaded by PEFT onto a tiny random Qwen3.5, and the merged weights give the
logits of the archive's deltas added by hand to the base weights. Opt-in lane:
``pip install -e ".[export-check]"``, then ``pytest -m export_check tests/export/test_export_check.py``.

The archive is Tinker-format (split linear-attention ``in_proj_q/k/v``, ``unembed_tokens``). The
reference adds each module's ``B @ A * alpha / r`` to the weight it trains: the split parts to their
row blocks of the fused ``in_proj_qkv``, the unembedding to the output projection only (untied from
the input embeddings, as in training). PEFT drops keys that match no module without a word, so the
PEFT tests also check that each tensor of the export lands on a LoRA module and each LoRA module
gets one.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from click.testing import CliRunner
from safetensors.numpy import save

from searchr1.cli import main

# The lane's libraries are imported here, not with a module-level skip (pytest 8.0.0, the oldest
# release the test extra allows, fails collection on one under xdist): without them every test
# is skipped.
try:
    import peft
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
except ImportError as missing:
    LANE_MISSING: str | None = f"the export-check extra is not installed ({missing})"
else:
    LANE_MISSING = None

pytestmark = pytest.mark.skipif(LANE_MISSING is not None, reason=str(LANE_MISSING))

# Layers 0-2 linear attention (key_dim 32, value_dim 64), layer 3 full attention; tied embeddings.
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=True)
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
RANK, ALPHA = 4, 8
TOKENS_SEED = 7  # the input ids: a (2, 7) batch drawn from this seed


def make_base(folder: Path, *, vision_language: bool = False) -> Path:
    """A tiny random float32 Qwen3.5 saved in ``folder``: the text model alone
    (``Qwen3_5ForCausalLM``), or inside the image-text model as the published checkpoints are."""
    from transformers import Qwen3_5Config, Qwen3_5TextConfig  # here: importing them costs collection 1.7 s

    torch.manual_seed(0)
    if vision_language:
        config = Qwen3_5Config(text_config=TEXT, vision_config=VISION, tie_word_embeddings=True)
        model = Qwen3_5ForConditionalGeneration(config)
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TEXT))
    model.to(torch.float32).save_pretrained(folder)
    return folder


def load(cls, folder: Path):
    return cls.from_pretrained(folder, dtype=torch.float32)


def text_model(model):
    """The text model (``model`` of the causal LM, ``model.language_model`` of the image-text one)."""
    return getattr(model.model, "language_model", model.model)


def weight_of(model, path: str):
    return model.lm_head.weight if path == "lm_head" else text_model(model).get_submodule(path).weight


def trained_modules(config) -> dict[str, tuple[str, slice]]:
    """Every module Tinker trains, by its raw name (after ``base_model.model.model.``), with the
    weight it changes and the rows of it: ``in_proj_q/k/v`` are the query, key and value row blocks
    of the fused ``in_proj_qkv``, and ``unembed_tokens`` is the output projection ``lm_head``."""
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    value_dim = config.linear_num_value_heads * config.linear_value_head_dim
    split = {"in_proj_q": slice(0, key_dim), "in_proj_k": slice(key_dim, 2 * key_dim),
             "in_proj_v": slice(2 * key_dim, 2 * key_dim + value_dim)}
    whole = slice(None)
    modules = {"unembed_tokens": ("lm_head", whole)}
    for n, kind in enumerate(config.layer_types):
        layer = f"layers.{n}"
        if kind == "full_attention":
            modules |= {f"{layer}.self_attn.{m}": (f"{layer}.self_attn.{m}", whole)
                        for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
        else:
            modules |= {f"{layer}.linear_attn.{m}": (f"{layer}.linear_attn.in_proj_qkv", rows)
                        for m, rows in split.items()}
            modules |= {f"{layer}.linear_attn.{m}": (f"{layer}.linear_attn.{m}", whole)
                        for m in ("in_proj_z", "out_proj")}
        modules |= {f"{layer}.mlp.{m}": (f"{layer}.mlp.{m}", whole) for m in ("gate_proj", "up_proj", "down_proj")}
    return modules


def make_archive(path: Path, base_model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A Tinker checkpoint archive at ``path`` (its config, the Tinker-format tensors and the
    completion marker) training every module of :func:`trained_modules` with random ``A`` (r, in)
    and ``B`` (out, r), large enough that every delta moves the logits; returns them by raw name."""
    rng = np.random.default_rng(1)
    raw = {}
    for name, (target, rows) in trained_modules(base_model.config.get_text_config()).items():
        out_features, in_features = weight_of(base_model, target)[rows].shape
        raw[name] = ((0.05 * rng.standard_normal((RANK, in_features))).astype(np.float32),
                     (0.05 * rng.standard_normal((out_features, RANK))).astype(np.float32))
    tensors = {f"base_model.model.model.{name}.lora_{part}.weight": matrix
               for name, pair in raw.items() for part, matrix in zip("AB", pair)}
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": "all-linear"}
    members = {"adapter_config.json": json.dumps(config).encode(), "adapter_model.safetensors": save(tensors),
               "checkpoint_complete": b""}
    with tarfile.open(path, "w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return raw


def reference_model(cls, base: Path, raw: dict[str, tuple[np.ndarray, np.ndarray]]):
    """The base model with each raw module's ``B @ A * alpha / r`` added by hand to the rows of the
    weight it trains; ``lm_head`` is untied first, so the input embeddings keep the base matrix."""
    model = load(cls, base)
    modules = trained_modules(model.config.get_text_config())
    embed = text_model(model).embed_tokens.weight.detach().clone()
    with torch.no_grad():
        for name, (a, b) in raw.items():
            target, rows = modules[name]
            delta = torch.from_numpy(b) @ torch.from_numpy(a) * (ALPHA / RANK)
            if target == "lm_head":
                model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + delta)
            else:
                weight_of(model, target)[rows] += delta
    assert torch.equal(text_model(model).embed_tokens.weight, embed)
    return model


def logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        tokens = torch.randint(0, TEXT["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(TOKENS_SEED))
        return model(input_ids=tokens, use_cache=False).logits


def export(archive: Path, base: Path, out: Path, *options: str) -> None:
    result = CliRunner().invoke(main, ["export", "--from-archive", str(archive), "--base", str(base),
                                       "--out", str(out), *options])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"


def assert_every_tensor_lands(model, out: Path) -> None:
    """PEFT loads each tensor of the export onto a LoRA module, and each LoRA module the config
    creates gets one (PEFT's own loader only warns on missing keys and drops unexpected ones)."""
    weights = load_file(out / "adapter_model.safetensors")
    result = peft.set_peft_model_state_dict(model, dict(weights))
    assert result.unexpected_keys == []
    assert [key for key in result.missing_keys if "lora_" in key] == []
    created = {key.replace(".default.", ".") for key in model.state_dict() if "lora_" in key}
    assert created == set(weights)


@pytest.mark.export_check
def test_peft_loads_the_export_with_no_missing_or_unexpected_lora_key_and_the_logits_of_the_deltas_applied_by_hand(
        tmp_path):
    base, archive, out = make_base(tmp_path / "base"), tmp_path / "checkpoint.tar", tmp_path / "out"
    raw = make_archive(archive, load(AutoModelForCausalLM, base))
    export(archive, base, out)

    names = {path.name for path in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= names
    assert "checkpoint_complete" not in names
    model = peft.PeftModel.from_pretrained(load(AutoModelForCausalLM, base), str(out))
    assert_every_tensor_lands(model, out)
    adapted = logits(model)
    assert (adapted - logits(load(AutoModelForCausalLM, base))).abs().max() > 1e-2
    torch.testing.assert_close(adapted, logits(reference_model(AutoModelForCausalLM, base, raw)), atol=1e-5, rtol=1e-4)


@pytest.mark.export_check
def test_merged_weights_give_the_same_logits(tmp_path):
    base, archive, out = make_base(tmp_path / "base"), tmp_path / "checkpoint.tar", tmp_path / "out"
    raw = make_archive(archive, load(AutoModelForCausalLM, base))
    export(archive, base, out, "--merge")

    merged = load(AutoModelForCausalLM, out / "merged")
    # The unembedding delta lands on an untied lm_head; the input embeddings stay the base's.
    assert torch.equal(text_model(merged).embed_tokens.weight,
                       text_model(load(AutoModelForCausalLM, base)).embed_tokens.weight)
    torch.testing.assert_close(logits(merged), logits(reference_model(AutoModelForCausalLM, base, raw)),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.export_check
def test_the_vision_language_layout_loads_onto_the_image_text_model(tmp_path):
    base = make_base(tmp_path / "base", vision_language=True)
    archive, out = tmp_path / "checkpoint.tar", tmp_path / "out"
    raw = make_archive(archive, load(Qwen3_5ForConditionalGeneration, base))
    export(archive, base, out)

    model = peft.PeftModel.from_pretrained(load(Qwen3_5ForConditionalGeneration, base), str(out))
    assert_every_tensor_lands(model, out)
    torch.testing.assert_close(logits(model), logits(reference_model(Qwen3_5ForConditionalGeneration, base, raw)),
                               atol=1e-5, rtol=1e-4)

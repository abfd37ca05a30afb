"""Tinker-format Qwen3.5 LoRA archives converted for PEFT and vLLM, checked without torch: the
shipped Qwen3.5-4B shapes, the exact fold of the split projections, every refusal, the merge.

The receiving libraries themselves (transformers + PEFT on a tiny real Qwen3.5) check the same
conversion in the opt-in lane, tests/export/test_export_check.py."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.export.adapter import check_adapter, vllm_max_lora_rank
from searchr1.export.card import front_matter
from searchr1.export.convert import (
    ConversionError,
    ExportFormat,
    Layout,
    RawAdapter,
    convert,
    fold_qkv,
    write_converted,
)
from searchr1.export.merge import merge_into
from searchr1.export.qwen35 import QWEN35_4B, ConfigError, LayerType, text_dims
from searchr1.twin.archive import STAND_IN_CONFIG, trained_shapes

STAND_IN = text_dims(STAND_IN_CONFIG, "stand-in")


def test_the_shipped_config_gives_qwen35_4b_published_shapes():
    """The numbers Qwen/Qwen3.5-4B publishes (hidden 2560, gated q_proj 8192, linear attention
    qkv 8192, z 4096, b/a 32, out 4096 -> 2560, MLP 9216, vocabulary 248,320), typed here from the
    model's description, not from the code."""
    shapes = QWEN35_4B.linear_modules()
    assert QWEN35_4B.layer_types.count(LayerType.FULL_ATTENTION) == 8 and len(QWEN35_4B.layer_types) == 32
    assert [n for n, t in enumerate(QWEN35_4B.layer_types) if t is LayerType.FULL_ATTENTION] == list(range(3, 32, 4))
    assert shapes["layers.3.self_attn.q_proj"] == (2560, 8192)
    assert shapes["layers.3.self_attn.k_proj"] == shapes["layers.3.self_attn.v_proj"] == (2560, 1024)
    assert shapes["layers.3.self_attn.o_proj"] == (4096, 2560)
    assert shapes["layers.0.linear_attn.in_proj_qkv"] == (2560, 8192)
    assert shapes["layers.0.linear_attn.in_proj_z"] == (2560, 4096)
    assert shapes["layers.0.linear_attn.in_proj_b"] == shapes["layers.0.linear_attn.in_proj_a"] == (2560, 32)
    assert shapes["layers.0.linear_attn.out_proj"] == (4096, 2560)
    assert shapes["layers.0.mlp.down_proj"] == (9216, 2560) and shapes["lm_head"] == (2560, 248320)
    assert "layers.0.self_attn.q_proj" not in shapes and "layers.3.linear_attn.in_proj_z" not in shapes
    assert QWEN35_4B.tie_word_embeddings


@pytest.mark.parametrize("change, field", [
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding"] * 4}, "layer_types"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
])
def test_a_config_that_is_not_qwen35_is_named_by_its_field(change, field):
    with pytest.raises(ConfigError, match=field):
        text_dims({**STAND_IN_CONFIG, **change}, "config.json")


def raw_archive(dims, rank: int, *, seed: int = 0, attn=True, mlp=True, unembed=True, alpha=16,
                dtype=np.float32, config=None) -> RawAdapter:
    """A Tinker-format adapter for ``dims``, as the twin's archive names its tensors."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (fan_in, fan_out) in trained_shapes(dict(STAND_IN_CONFIG), train_attn=attn, train_mlp=mlp,
                                                    train_unembed=unembed).items():
        tensors[f"base_model.model.model.{module}.lora_A.weight"] = rng.standard_normal((rank, fan_in)).astype(dtype)
        tensors[f"base_model.model.model.{module}.lora_B.weight"] = rng.standard_normal((fan_out, rank)).astype(dtype)
    return RawAdapter(config or {"r": rank, "lora_alpha": alpha}, tensors)


def raw_deltas(raw: RawAdapter, dims) -> dict[str, np.ndarray]:
    """Each base-model module's delta, by hand from the raw tensors: split parts go into their
    rows of in_proj_qkv, unembed_tokens is the output projection lm_head."""
    scale = raw.alpha / raw.rank
    shapes = dims.linear_modules()
    offsets = {"in_proj_q": 0, "in_proj_k": dims.key_dim, "in_proj_v": 2 * dims.key_dim}
    deltas: dict[str, np.ndarray] = {}
    for name, a in raw.tensors.items():
        if ".lora_A." not in name:
            continue
        b = raw.tensors[name.replace(".lora_A.", ".lora_B.")]
        path = name.removeprefix("base_model.model.model.").removesuffix(".lora_A.weight")
        part = (b.astype(np.float64) @ a.astype(np.float64)) * scale
        layer, _, module = path.rpartition(".")
        if module in offsets:
            fused = f"{layer}.in_proj_qkv"
            deltas.setdefault(fused, np.zeros(shapes[fused][::-1]))
            deltas[fused][offsets[module]:offsets[module] + part.shape[0]] += part
        else:
            deltas["lm_head" if path == "unembed_tokens" else path] = part
    return deltas


def converted_deltas(tensors: dict[str, np.ndarray], config: dict, prefix: str) -> dict[str, np.ndarray]:
    """Each module's delta as PEFT computes it from the converted adapter (rank_pattern/alpha_pattern)."""
    deltas = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        module = name.removesuffix(".lora_A.weight")
        leaf = module.rsplit(".", 1)[-1]
        r = config["rank_pattern"].get(leaf, config["r"])
        alpha = config["alpha_pattern"].get(leaf, config["lora_alpha"])
        b = tensors[f"{module}.lora_B.weight"]
        path = "lm_head" if module == "base_model.model.lm_head" else module.removeprefix(prefix)
        deltas[path] = (b.astype(np.float64) @ a.astype(np.float64)) * alpha / r
    return deltas


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(1, 6), attn=st.booleans(), mlp=st.booleans(), unembed=st.booleans(),
       alpha=st.sampled_from([1, 8, 16, 32, 3.5]), layout=st.sampled_from(list(Layout)), seed=st.integers(0, 99))
def test_conversion_keeps_every_module_delta_and_drops_no_tensor(rank, attn, mlp, unembed, alpha, layout, seed):
    """Whatever the run trained, every module's B A alpha/r after conversion is what the raw
    archive's tensors give by hand, and every raw tensor is used."""
    if not (attn or mlp or unembed):
        attn = True
    raw = raw_archive(STAND_IN, rank, seed=seed, attn=attn, mlp=mlp, unembed=unembed, alpha=alpha)
    out = convert(raw, STAND_IN, export_format=ExportFormat.PEFT, layout=layout, base_model="b")
    got = converted_deltas(out.tensors, out.config, layout.prefix)
    want = raw_deltas(raw, STAND_IN)
    assert got.keys() == want.keys()
    for module in want:
        np.testing.assert_allclose(got[module], want[module], rtol=1e-6, atol=1e-9, err_msg=module)
    assert all(name.startswith((layout.prefix, "base_model.model.lm_head.")) for name in out.tensors)
    assert out.folded_layers == (3 if attn else 0) and out.has_unembed == unembed


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(1, 5), parts=st.sets(st.sampled_from(["in_proj_q", "in_proj_k", "in_proj_v"]), min_size=1),
       seed=st.integers(0, 99))
def test_folding_the_split_projections_stacks_each_part_in_its_rows(rank, parts, seed):
    rng = np.random.default_rng(seed)
    sizes = dict(zip(["in_proj_q", "in_proj_k", "in_proj_v"], [s for _, s in STAND_IN.fused_qkv_split()]))
    given_parts = {p: {"A": rng.standard_normal((rank, STAND_IN.hidden_size)),
                       "B": rng.standard_normal((sizes[p], rank))} for p in parts}
    a, b = fold_qkv(given_parts, STAND_IN, rank)
    rows = [given_parts[p]["B"] @ given_parts[p]["A"] if p in given_parts else np.zeros((sizes[p], STAND_IN.hidden_size))
            for p in ("in_proj_q", "in_proj_k", "in_proj_v")]
    np.testing.assert_allclose(b @ a, np.vstack(rows), atol=1e-12)


def test_bfloat16_tensors_keep_their_exact_bits():
    raw = raw_archive(STAND_IN, 2, dtype=ml_dtypes.bfloat16)
    out = convert(raw, STAND_IN, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="b")
    name = "base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"
    assert out.tensors[name].dtype == ml_dtypes.bfloat16
    assert out.tensors[name].tobytes() == raw.tensors[name].tobytes()


def _without(raw: RawAdapter, name: str) -> RawAdapter:
    return RawAdapter(raw.config, {k: v for k, v in raw.tensors.items() if k != name})


def _renamed(raw: RawAdapter, old: str, new: str) -> RawAdapter:
    return RawAdapter(raw.config, {k.replace(old, new): v for k, v in raw.tensors.items()})


def _reshaped(raw: RawAdapter, name: str) -> RawAdapter:
    tensors = dict(raw.tensors)
    tensors[name] = np.zeros((tensors[name].shape[0], tensors[name].shape[1] + 1), dtype=np.float32)
    return RawAdapter(raw.config, tensors)


BASE = raw_archive(STAND_IN, 4)
Q = "base_model.model.model.layers.3.self_attn.q_proj"


@pytest.mark.parametrize("raw, fmt, says", [
    (_renamed(BASE, "mlp.up_proj", "mlp.side_proj"), "peft", "layers.0.mlp.side_proj"),
    (_renamed(BASE, "layers.3.self_attn", "layers.1.self_attn"), "peft", "no module layers.1.self_attn"),
    (_reshaped(BASE, f"{Q}.lora_A.weight"), "peft", f"{Q}.lora_A.weight: shape (4, 17)"),
    (_reshaped(BASE, f"{Q}.lora_B.weight"), "peft", f"{Q}.lora_B.weight: shape (32, 5)"),
    (_without(BASE, f"{Q}.lora_B.weight"), "peft", "lora_B is missing"),
    (RawAdapter({**BASE.config, "modules_to_save": ["lm_head"]}, BASE.tensors), "peft", "modules_to_save"),
    (RawAdapter({**BASE.config, "use_dora": True}, BASE.tensors), "peft", "use_dora"),
    (RawAdapter({**BASE.config, "use_rslora": True}, BASE.tensors), "peft", "use_rslora"),
    (RawAdapter({**BASE.config, "peft_type": "IA3"}, BASE.tensors), "peft", "peft_type"),
    (RawAdapter({**BASE.config, "r": 0}, BASE.tensors), "peft", "r 0"),
    (BASE, "vllm", "unembed_tokens.lora_A.weight: vLLM applies no LoRA"),
])
def test_an_archive_that_would_not_land_exactly_is_refused_naming_the_tensor_or_field(raw, fmt, says):
    with pytest.raises(ConversionError, match=None) as caught:
        convert(raw, STAND_IN, export_format=ExportFormat(fmt), layout=Layout.CAUSAL_LM, base_model="b")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_raw_tinker_config_with_only_rank_and_alpha_converts():
    out = convert(RawAdapter({"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}, BASE.tensors), STAND_IN,
                  export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="Qwen/Qwen3.5-4B")
    assert out.config["rank_pattern"] == {"in_proj_qkv": 12} and out.config["alpha_pattern"] == {"in_proj_qkv": 24}
    assert out.config["base_model_name_or_path"] == "Qwen/Qwen3.5-4B" and out.config["modules_to_save"] is None


def test_vllm_gets_the_published_checkpoints_prefix_and_a_max_lora_rank_it_accepts(tmp_path):
    raw = raw_archive(STAND_IN, 32, unembed=False)
    out = convert(raw, STAND_IN, export_format=ExportFormat.VLLM, layout=Layout.CAUSAL_LM, base_model="b")
    assert all(k.startswith("base_model.model.model.language_model.layers.") for k in out.tensors)
    assert out.max_rank == 96 and out.vllm_max_lora_rank() == 128
    assert [vllm_max_lora_rank(r) for r in (1, 4, 8, 9, 32, 33, 64, 96, 192, 300)] == [1, 8, 8, 16, 32, 64, 64, 128,
                                                                                      256, 320]


def test_the_written_adapter_reads_back_clean_and_a_stray_key_is_named(tmp_path):
    out = convert(BASE, STAND_IN, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="b")
    write_converted(out, tmp_path / "a", {"format": "pt"})
    assert check_adapter(tmp_path / "a", STAND_IN, Layout.CAUSAL_LM).problems == []
    assert not (tmp_path / "a" / "checkpoint_complete").exists()
    # The same files read as the image-text model's: every key is under another prefix.
    problems = check_adapter(tmp_path / "a", STAND_IN, Layout.VISION_LANGUAGE).problems
    assert problems and all("no such module" in p for p in problems if "lm_head" not in p)


def test_the_model_card_front_matter_links_the_adapter_to_its_base():
    import yaml

    lines = front_matter("Qwen/Qwen3.5-4B")
    assert lines[0] == "---" and lines[lines.index("---", 1)] == "---"
    metadata = yaml.safe_load("\n".join(lines[1:lines.index("---", 1)]))
    assert metadata["base_model"] == "Qwen/Qwen3.5-4B" and metadata["library_name"] == "peft"
    assert "base_model:adapter:Qwen/Qwen3.5-4B" in metadata["tags"]


def _base_checkpoint(folder: Path, dims, *, seed: int = 1, layout: Layout = Layout.CAUSAL_LM) -> dict[str, np.ndarray]:
    """A base model folder with random bfloat16 weights of ``dims`` (tied: no lm_head.weight)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    prefix = "model." if layout is Layout.CAUSAL_LM else "model.language_model."
    weights = {f"{prefix}{path}.weight": rng.standard_normal((fan_out, fan_in)).astype(ml_dtypes.bfloat16)
               for path, (fan_in, fan_out) in dims.linear_modules().items() if path != "lm_head"}
    weights[f"{prefix}embed_tokens.weight"] = rng.standard_normal((dims.vocab_size, dims.hidden_size)).astype(
        ml_dtypes.bfloat16)
    folder.mkdir(parents=True)
    half = sorted(weights)[: len(weights) // 2]
    save_file({k: weights[k] for k in half}, str(folder / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({k: v for k, v in weights.items() if k not in half}, str(folder / "model-00002-of-00002.safetensors"),
              metadata={"format": "pt"})
    index = {"weight_map": {k: "model-00001-of-00002.safetensors" if k in half else "model-00002-of-00002.safetensors"
                            for k in weights}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(STAND_IN_CONFIG))
    (folder / "tokenizer.json").write_text("{}")
    return weights


def test_merging_adds_each_delta_to_its_weight_and_unties_the_output_projection(tmp_path):
    from safetensors import safe_open

    base = _base_checkpoint(tmp_path / "base", STAND_IN)
    raw = raw_archive(STAND_IN, 4, alpha=8)
    out = convert(raw, STAND_IN, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="b")
    report = merge_into(tmp_path / "base", out, tmp_path / "merged")
    merged = {}
    for file in sorted((tmp_path / "merged").glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as weights:
            merged |= {k: weights.get_tensor(k) for k in weights.keys()}
    deltas = raw_deltas(raw, STAND_IN)
    assert report.untied and report.merged == len(deltas)
    for path, delta in deltas.items():
        source = "model.embed_tokens.weight" if path == "lm_head" else f"model.{path}.weight"
        key = "lm_head.weight" if path == "lm_head" else source
        want = (base[source].astype(np.float32) + delta).astype(ml_dtypes.bfloat16)
        assert merged[key].tobytes() == want.tobytes(), key
    untouched = [k for k in base if k.removeprefix("model.").removesuffix(".weight") not in deltas]
    assert "model.embed_tokens.weight" in untouched  # the input embeddings stay the base's
    assert all(merged[k].tobytes() == base[k].tobytes() for k in untouched)
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    index = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())
    assert config["tie_word_embeddings"] is False and "lm_head.weight" in index["weight_map"]
    assert (tmp_path / "merged" / "tokenizer.json").is_file()


def test_a_delta_with_no_weight_in_the_base_writes_nothing(tmp_path):
    _base_checkpoint(tmp_path / "base", STAND_IN)
    files = sorted((tmp_path / "base").glob("*.safetensors"))
    files[-1].unlink()  # half the weights are gone
    out = convert(BASE, STAND_IN, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="b")
    with pytest.raises(ConversionError, match="no weight for the delta"):
        merge_into(tmp_path / "base", out, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_a_qwen35_4b_archive_converts_whole_and_reads_back_clean_against_the_shipped_config(tmp_path):
    from searchr1.export.qwen35 import SHIPPED_CONFIG

    config = json.loads(SHIPPED_CONFIG.read_text())["text_config"]
    rng = np.random.default_rng(0)
    tensors = {}
    for module, (fan_in, fan_out) in trained_shapes(config, train_attn=True, train_mlp=True,
                                                    train_unembed=True).items():
        tensors[f"base_model.model.model.{module}.lora_A.weight"] = rng.standard_normal((4, fan_in)).astype(np.float32)
        tensors[f"base_model.model.model.{module}.lora_B.weight"] = np.zeros((fan_out, 4), dtype=np.float32)
    raw = RawAdapter({"r": 4, "lora_alpha": 8}, tensors)
    out = convert(raw, QWEN35_4B, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="Qwen/Qwen3.5-4B")
    assert out.folded_layers == 24 and out.has_unembed
    write_converted(out, tmp_path / "a", {"format": "pt"})
    assert check_adapter(tmp_path / "a", QWEN35_4B, Layout.CAUSAL_LM).problems == []
    assert out.tensors["base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_B.weight"].shape == (8192, 12)
    assert out.tensors["base_model.model.lm_head.lora_B.weight"].shape == (248320, 4)
    # The same archive against a config whose q_proj is not gated is refused at q_proj's B.
    ungated = text_dims({**config, "head_dim": 128}, "ungated")
    with pytest.raises(ConversionError, match=r"layers\.3\.self_attn\.q_proj\.lora_B\.weight: shape \(8192, 4\)"):
        convert(raw, ungated, export_format=ExportFormat.PEFT, layout=Layout.CAUSAL_LM, base_model="b")

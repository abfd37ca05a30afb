"""Convert a Tinker-format LoRA checkpoint of Qwen3.5 into an adapter PEFT or vLLM loads.

A PyTRIO (Tinker-like) sampler checkpoint downloads as a tar holding ``adapter_config.json``
(``r`` and ``lora_alpha``; ``base_model_name_or_path`` may be missing), ``adapter_model.safetensors``
and a ``checkpoint_complete`` marker, as the Tinker CLI's ``checkpoint download`` describes it. The
tensors are named as Tinker trains them, not as the model is built (tinker-cookbook's
``tinker_cookbook/weights/`` calls this the "Tinker adapter format"):

    base_model.model.model.layers.N.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
    base_model.model.model.layers.N.linear_attn.in_proj_{q,k,v}.lora_{A,B}.weight   (split)
    base_model.model.model.layers.N.linear_attn.{in_proj_z,in_proj_b,in_proj_a,out_proj}...
    base_model.model.model.layers.N.mlp.{gate,up,down}_proj.lora_{A,B}.weight
    base_model.model.model.unembed_tokens.lora_{A,B}.weight                          (train_unembed)

with ``lora_A`` ``(r, in)`` and ``lora_B`` ``(out, r)``; the delta of a module is
``B @ A * lora_alpha / r``. Converting (:func:`convert`):

- **the split linear-attention projections are folded exactly into the fused ``in_proj_qkv``**
  that transformers and vLLM build: ``A`` stacks ``A_q, A_k, A_v`` along the rank and ``B`` is
  block-diagonal (``B_q`` in the query rows and the first ``r`` columns, and so on), so
  ``B @ A = [B_q A_q; B_k A_k; B_v A_v]``. The fused module has rank ``3r``; ``rank_pattern`` and
  ``alpha_pattern`` give it ``3r`` and ``3 x lora_alpha``, which keeps ``alpha / r`` and so the
  delta unchanged (a part that was not trained stays zero);
- **``unembed_tokens`` becomes ``lm_head``**, the output projection it trains. With tied
  embeddings (Qwen3.5-4B) ``lm_head`` shares ``embed_tokens``' matrix, and PEFT wraps it as a
  linear layer, so the delta reaches the logits only, as in training. vLLM applies no LoRA to
  Qwen3.5's ``lm_head``: ``--format vllm`` refuses an unembedding LoRA (serve merged weights);
- **the prefix follows the model that loads it**: ``base_model.model.model.`` for
  ``Qwen3_5ForCausalLM`` (what ``AutoModelForCausalLM`` builds from any Qwen3.5 checkpoint) and
  ``base_model.model.model.language_model.`` for ``Qwen3_5ForConditionalGeneration`` (the
  published checkpoints, as transformers' image-text class and vLLM load them);
- **the PEFT config is written fresh**: ``target_modules`` are the modules that hold tensors,
  with ``rank_pattern``/``alpha_pattern`` for the fused projection.

Every tensor of the archive lands in the output, or the conversion refuses (one line naming the
tensor or field): an unknown module, a shape that does not match the base model's config, an A
without its B, ``modules_to_save``, DoRA, rsLoRA, biases. PEFT itself drops keys that match no
module without a word (``set_peft_model_state_dict`` loads with ``strict=False``), so these checks
are what stands between a wrong archive and a silently unchanged model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

from searchr1.export.qwen35 import LayerType, Qwen35Text

RAW_PREFIX = "base_model.model.model."
RAW_TENSOR = re.compile(
    r"^base_model\.model\.model\.(?:(?P<unembed>unembed_tokens)|layers\.(?P<layer>\d+)\.(?P<block>self_attn|linear_attn|mlp)"
    r"\.(?P<module>[a-z_]+))\.lora_(?P<part>[AB])\.weight$")
SPLIT_QKV = ("in_proj_q", "in_proj_k", "in_proj_v")
FUSED_QKV = "in_proj_qkv"
UNEMBED = "lm_head"
COMPLETE_MARKER = "checkpoint_complete"
# vLLM's --max-lora-rank accepts only these (vllm/config/lora.py, MaxLoRARanks).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Config fields whose setting no converted adapter can honour (vLLM rejects modules_to_save and
# DoRA; rsLoRA scales by alpha/sqrt(r), which the fold's alpha_pattern would have to change).
REFUSED_CONFIG = {"modules_to_save": "full copies of modules, not a LoRA (vLLM refuses them)",
                  "use_dora": "DoRA (vLLM refuses it)", "use_rslora": "rsLoRA scaling"}


class ExportFormat(str, Enum):
    PEFT = "peft"
    VLLM = "vllm"


class Layout(str, Enum):
    """Where the text model's modules sit in the model that loads the adapter."""

    CAUSAL_LM = "Qwen3_5ForCausalLM"
    VISION_LANGUAGE = "Qwen3_5ForConditionalGeneration"

    @property
    def prefix(self) -> str:
        return "base_model.model.model." if self is Layout.CAUSAL_LM else "base_model.model.model.language_model."


class ConversionError(ValueError):
    """The archive cannot be converted; the message is one line naming the tensor or field."""


@dataclass(frozen=True)
class RawAdapter:
    """A Tinker-format adapter as read from its two files."""

    config: Mapping[str, object]  # adapter_config.json as read
    tensors: dict[str, np.ndarray]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        rank = self.config.get("r")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ConversionError(f"adapter_config.json: r {rank!r} is not a positive whole number")
        return rank

    @property
    def alpha(self) -> float:
        alpha = self.config.get("lora_alpha", self.rank)
        if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
            raise ConversionError(f"adapter_config.json: lora_alpha {alpha!r} is not a positive number")
        return alpha


class PeftConfig(TypedDict):
    """``adapter_config.json`` as :func:`convert` writes it: a plain LoRA, PEFT's field names."""

    peft_type: Literal["LORA"]
    task_type: Literal["CAUSAL_LM"]
    base_model_name_or_path: str
    r: int
    lora_alpha: float
    lora_dropout: float
    bias: Literal["none"]
    use_rslora: bool
    use_dora: bool
    modules_to_save: None
    fan_in_fan_out: bool
    inference_mode: bool
    target_modules: list[str]
    rank_pattern: dict[str, int]  # the fused in_proj_qkv's rank, 3r
    alpha_pattern: dict[str, float]


@dataclass(frozen=True)
class Converted:
    """An adapter ready to write: PEFT's config, its tensors and what was done."""

    config: PeftConfig
    tensors: dict[str, np.ndarray]
    layout: Layout
    export_format: ExportFormat
    folded_layers: int
    has_unembed: bool

    @property
    def max_rank(self) -> int:
        return max([self.config["r"], *self.config["rank_pattern"].values()])

    def vllm_max_lora_rank(self) -> int:
        """The smallest ``--max-lora-rank`` vLLM accepts that holds every module's rank."""
        return next(r for r in VLLM_MAX_LORA_RANKS if r >= self.max_rank)


def read_raw_adapter(folder: Path) -> RawAdapter:
    """The config and tensors of the adapter in ``folder`` (``adapter_config.json``,
    ``adapter_model.safetensors``); bfloat16 tensors are read exactly (``ml_dtypes``)."""
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy, which safetensors then reads
    from safetensors import SafetensorError, safe_open

    from searchr1.basics.jsonl import read_json_object

    weights_path = folder / "adapter_model.safetensors"
    config = read_json_object(folder / "adapter_config.json", ConversionError, "the adapter config")
    try:
        with safe_open(str(weights_path), framework="numpy") as weights:
            metadata = dict(weights.metadata() or {})
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise ConversionError(f"{weights_path}: not a readable safetensors file ({error})") from None
    return RawAdapter(config, tensors, metadata)


def _check_config(config: Mapping[str, object]) -> None:
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise ConversionError(f"adapter_config.json: peft_type {peft_type!r}, not LORA")
    for name, what in REFUSED_CONFIG.items():
        if config.get(name):
            raise ConversionError(f"adapter_config.json: {name} is set ({what}); only a plain LoRA converts")
    bias = config.get("bias", "none")
    if bias not in (None, "none"):
        raise ConversionError(f"adapter_config.json: bias {bias!r}; only a LoRA without biases converts")


def _module_path(match: re.Match[str]) -> str:
    """The text-model path of a raw tensor's module (``layers.3.linear_attn.in_proj_q``)."""
    if match["unembed"]:
        return UNEMBED
    return f"layers.{match['layer']}.{match['block']}.{match['module']}"


def _pairs(raw: RawAdapter) -> dict[str, dict[str, np.ndarray]]:
    """``module path -> {"A": ..., "B": ...}``, every tensor accounted for."""
    modules: dict[str, dict[str, np.ndarray]] = {}
    for name, tensor in raw.tensors.items():
        match = RAW_TENSOR.match(name)
        if match is None:
            raise ConversionError(f"tensor {name}: not a Tinker-format LoRA weight "
                                  f"({RAW_PREFIX}layers.N.<block>.<module>.lora_A/B.weight or unembed_tokens)")
        if tensor.ndim != 2:
            raise ConversionError(f"tensor {name}: shape {tuple(tensor.shape)}, not a matrix")
        modules.setdefault(_module_path(match), {})[match["part"]] = tensor
    for path, parts in sorted(modules.items()):
        if set(parts) != {"A", "B"}:
            missing = "B" if "A" in parts else "A"
            raise ConversionError(f"tensors {RAW_PREFIX}{path}.lora_*: lora_{missing} is missing")
    return modules


def _expected(dims: Qwen35Text) -> dict[str, tuple[int, int]]:
    """``raw module path -> (in, out)``: the base model's modules, with each linear-attention
    layer's ``in_proj_qkv`` also split into the parts Tinker trains."""
    shapes = dims.linear_modules()
    for n, kind in enumerate(dims.layer_types):
        if kind is LayerType.LINEAR_ATTENTION:
            for (_, size), module in zip(dims.fused_qkv_split(), SPLIT_QKV):
                shapes[f"layers.{n}.linear_attn.{module}"] = (dims.hidden_size, size)
    return shapes


def _check_shapes(path: str, a: np.ndarray, b: np.ndarray, rank: int, expected: tuple[int, int] | None) -> None:
    name = f"{RAW_PREFIX}{path}" if path != UNEMBED else f"{RAW_PREFIX}unembed_tokens"
    if expected is None:
        raise ConversionError(f"tensor {name}.lora_A.weight: no module {path} in the base model")
    fan_in, fan_out = expected
    if a.shape != (rank, fan_in):
        raise ConversionError(f"tensor {name}.lora_A.weight: shape {tuple(a.shape)}, expected (r, in) = "
                              f"({rank}, {fan_in}) for the base model's {path}")
    if b.shape != (fan_out, rank):
        raise ConversionError(f"tensor {name}.lora_B.weight: shape {tuple(b.shape)}, expected (out, r) = "
                              f"({fan_out}, {rank}) for the base model's {path}")


def fold_qkv(parts: Mapping[str, Mapping[str, np.ndarray]], dims: Qwen35Text, rank: int) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """``(A, B)`` of the fused ``in_proj_qkv`` from the split parts present (``in_proj_q`` …):
    ``A`` is ``(3r, hidden)``, ``B`` is ``(2 key_dim + value_dim, 3r)`` and block-diagonal, so that
    ``B @ A`` stacks each part's ``B_i @ A_i`` in the rows of its output."""
    some = next(iter(parts.values()))
    dtype = some["A"].dtype
    a = np.zeros((3 * rank, dims.hidden_size), dtype=dtype)
    b = np.zeros((2 * dims.key_dim + dims.value_dim, 3 * rank), dtype=dtype)
    row = 0
    for block, ((_, size), module) in enumerate(zip(dims.fused_qkv_split(), SPLIT_QKV)):
        if module in parts:
            a[block * rank:(block + 1) * rank] = parts[module]["A"]
            b[row:row + size, block * rank:(block + 1) * rank] = parts[module]["B"]
        row += size
    return a, b


def convert(raw: RawAdapter, dims: Qwen35Text, *, export_format: ExportFormat, layout: Layout,
            base_model: str) -> Converted:
    """The adapter PEFT (``layout``'s prefix) or vLLM (the published checkpoint's prefix) loads;
    raises :class:`ConversionError` on anything that would not land exactly."""
    _check_config(raw.config)
    rank, alpha = raw.rank, raw.alpha
    if export_format is ExportFormat.VLLM:
        layout = Layout.VISION_LANGUAGE  # vLLM serves Qwen3.5 as its image-text model
    modules = _pairs(raw)
    expected = _expected(dims)
    for path, parts in modules.items():
        _check_shapes(path, parts["A"], parts["B"], rank, expected.get(path))
    if UNEMBED in modules and export_format is ExportFormat.VLLM:
        raise ConversionError(f"tensor {RAW_PREFIX}unembed_tokens.lora_A.weight: vLLM applies no LoRA to "
                              "Qwen3.5's lm_head; export --format peft, or --merge the weights, or train "
                              "with --no-train-unembed")
    split: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    tensors: dict[str, np.ndarray] = {}
    for path, parts in sorted(modules.items()):
        layer_path, _, module = path.rpartition(".")
        if module in SPLIT_QKV:
            split.setdefault(layer_path, {})[module] = parts
            continue
        key = "base_model.model.lm_head" if path == UNEMBED else f"{layout.prefix}{path}"
        tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = parts["A"], parts["B"]
    for layer_path, split_parts in sorted(split.items()):
        if f"{layer_path}.{FUSED_QKV}" in modules:
            raise ConversionError(f"tensors {RAW_PREFIX}{layer_path}: both in_proj_qkv and its split parts")
        a, b = fold_qkv(split_parts, dims, rank)
        key = f"{layout.prefix}{layer_path}.{FUSED_QKV}"
        tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
    targets = sorted({name.rsplit(".", 3)[-3] for name in tensors})
    config: PeftConfig = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
        "use_dora": False, "modules_to_save": None, "fan_in_fan_out": False, "inference_mode": True,
        "target_modules": targets, "rank_pattern": {}, "alpha_pattern": {},
    }
    if split:
        config["rank_pattern"] = {FUSED_QKV: 3 * rank}
        config["alpha_pattern"] = {FUSED_QKV: 3 * alpha}
    return Converted(config, tensors, layout, export_format, folded_layers=len(split),
                     has_unembed=UNEMBED in modules)


def write_converted(converted: Converted, folder: Path, metadata: Mapping[str, str]) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` into ``folder`` (each written
    whole, then renamed into place)."""
    import ml_dtypes  # noqa: F401 - lets safetensors.numpy write bfloat16
    from safetensors.numpy import save

    from searchr1.basics.fileio import write_bytes_atomically, write_text_atomically

    folder.mkdir(parents=True, exist_ok=True)
    data = save({k: np.ascontiguousarray(v) for k, v in converted.tensors.items()}, metadata=dict(metadata))
    write_bytes_atomically(folder / "adapter_model.safetensors", data)
    write_text_atomically(folder / "adapter_config.json", json.dumps(converted.config, indent=2, sort_keys=True) + "\n")

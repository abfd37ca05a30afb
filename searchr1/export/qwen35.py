"""Qwen3.5's text model as a LoRA adapter sees it: every linear module a LoRA can target, with
its ``(in_features, out_features)``, derived from the model's ``config.json``.

The structure follows transformers' ``models/qwen3_5`` (``configuration_qwen3_5.py``,
``modeling_qwen3_5.py``):

- ``layer_types`` lists each decoder layer's kind; without it, every ``full_attention_interval``-th
  layer (default 4) is full attention and the others linear attention (Gated DeltaNet);
- a full-attention layer has ``self_attn.{q,k,v,o}_proj``; its ``q_proj`` is **gated**: it
  outputs a query and a gate per head, ``2 x heads x head_dim``;
- a linear-attention layer has ``linear_attn.in_proj_qkv`` (query, key and value fused, in that
  order: ``key_dim, key_dim, value_dim``), ``in_proj_z`` (``value_dim``), ``in_proj_b`` and
  ``in_proj_a`` (one per value head) and ``out_proj`` (``value_dim -> hidden``), where
  ``key_dim = linear_num_key_heads x linear_key_head_dim`` and
  ``value_dim = linear_num_value_heads x linear_value_head_dim``;
- every layer has ``mlp.{gate,up,down}_proj``;
- ``embed_tokens`` and ``lm_head`` (``hidden -> vocab``) share one matrix when
  ``tie_word_embeddings``.

Module paths here are relative to the text model (``layers.3.self_attn.q_proj``); where they
sit in a checkpoint (``model.`` or ``model.language_model.``) is the layout's business
(:mod:`searchr1.export.convert`).

``QWEN35_4B`` is Qwen/Qwen3.5-4B's published text configuration (``qwen35_4b_config.json``,
shipped beside this file): 32 layers (three linear-attention layers, then one full-attention
layer), hidden 2560, intermediate 9216, vocabulary 248,320, tied embeddings, 16 query and 4
key/value heads of 256, linear attention with 16 key heads and 32 value heads of 128.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

SHIPPED_CONFIG = Path(__file__).with_name("qwen35_4b_config.json")
QWEN35_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")


class LayerType(str, Enum):
    LINEAR_ATTENTION = "linear_attention"
    FULL_ATTENTION = "full_attention"


class ConfigError(ValueError):
    """A config.json that does not describe a Qwen3.5 text model; the message names the field."""


@dataclass(frozen=True)
class Qwen35Text:
    """The dimensions of a Qwen3.5 text model (``text_config`` of the published checkpoints)."""

    hidden_size: int
    intermediate_size: int
    vocab_size: int
    layer_types: tuple[LayerType, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_key_head_dim: int
    linear_num_value_heads: int
    linear_value_head_dim: int
    tie_word_embeddings: bool
    source: str
    nested: bool = False  # the config nests it as text_config, as the published image-text checkpoints do

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    def linear_modules(self) -> dict[str, tuple[int, int]]:
        """``path -> (in_features, out_features)`` of every linear module of the text model."""
        hidden = self.hidden_size
        attention_out = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        modules: dict[str, tuple[int, int]] = {}
        for n, kind in enumerate(self.layer_types):
            if kind is LayerType.FULL_ATTENTION:
                modules |= {f"layers.{n}.self_attn.q_proj": (hidden, 2 * attention_out),  # query and gate
                            f"layers.{n}.self_attn.k_proj": (hidden, kv),
                            f"layers.{n}.self_attn.v_proj": (hidden, kv),
                            f"layers.{n}.self_attn.o_proj": (attention_out, hidden)}
            else:
                modules |= {f"layers.{n}.linear_attn.in_proj_qkv": (hidden, 2 * self.key_dim + self.value_dim),
                            f"layers.{n}.linear_attn.in_proj_z": (hidden, self.value_dim),
                            f"layers.{n}.linear_attn.in_proj_b": (hidden, self.linear_num_value_heads),
                            f"layers.{n}.linear_attn.in_proj_a": (hidden, self.linear_num_value_heads),
                            f"layers.{n}.linear_attn.out_proj": (self.value_dim, hidden)}
            modules |= {f"layers.{n}.mlp.gate_proj": (hidden, self.intermediate_size),
                        f"layers.{n}.mlp.up_proj": (hidden, self.intermediate_size),
                        f"layers.{n}.mlp.down_proj": (self.intermediate_size, hidden)}
        modules["lm_head"] = (hidden, self.vocab_size)
        return modules

    def fused_qkv_split(self) -> tuple[tuple[str, int], ...]:
        """The parts of a linear-attention layer's ``in_proj_qkv`` output, in order."""
        return (("q", self.key_dim), ("k", self.key_dim), ("v", self.value_dim))


def _whole(config: Mapping[str, object], name: str, source: str, *, default: int | None = None) -> int:
    value = config.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{source}: {name} {value!r} is not a positive whole number")
    return value


def text_dims(config: Mapping[str, object], source: str) -> Qwen35Text:
    """The text model of a Qwen3.5 ``config.json`` (its ``text_config`` when nested, as in the
    published vision-language checkpoints). Raises :class:`ConfigError` naming the field at fault."""
    text = config.get("text_config", config)
    if not isinstance(text, Mapping):
        raise ConfigError(f"{source}: text_config is not an object")
    model_type = text.get("model_type", config.get("model_type"))
    if model_type not in QWEN35_MODEL_TYPES:
        raise ConfigError(f"{source}: model_type {model_type!r}, not Qwen3.5 ({' or '.join(QWEN35_MODEL_TYPES)})")
    layers = _whole(text, "num_hidden_layers", source)
    raw_types = text.get("layer_types")
    if raw_types is None:
        interval = _whole(text, "full_attention_interval", source, default=4)
        raw_types = [LayerType.LINEAR_ATTENTION.value if (n + 1) % interval else LayerType.FULL_ATTENTION.value
                     for n in range(layers)]
    if not isinstance(raw_types, list) or len(raw_types) != layers:
        raise ConfigError(f"{source}: layer_types is not a list of num_hidden_layers ({layers}) entries")
    try:
        types = tuple(LayerType(t) for t in raw_types)
    except ValueError:
        raise ConfigError(f"{source}: layer_types holds a kind other than "
                          f"{' or '.join(t.value for t in LayerType)}") from None
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    if not isinstance(tied, bool):
        raise ConfigError(f"{source}: tie_word_embeddings {tied!r} is not true or false")
    return Qwen35Text(
        hidden_size=_whole(text, "hidden_size", source),
        intermediate_size=_whole(text, "intermediate_size", source),
        vocab_size=_whole(text, "vocab_size", source),
        layer_types=types,
        num_attention_heads=_whole(text, "num_attention_heads", source),
        num_key_value_heads=_whole(text, "num_key_value_heads", source),
        head_dim=_whole(text, "head_dim", source, default=256),
        linear_num_key_heads=_whole(text, "linear_num_key_heads", source, default=16),
        linear_key_head_dim=_whole(text, "linear_key_head_dim", source, default=128),
        linear_num_value_heads=_whole(text, "linear_num_value_heads", source, default=32),
        linear_value_head_dim=_whole(text, "linear_value_head_dim", source, default=128),
        tie_word_embeddings=tied,
        source=source,
        nested=text is not config,
    )


def read_config(path: Path) -> Qwen35Text:
    """The text dimensions of the ``config.json`` at ``path`` (a file, or a model folder holding one)."""
    from searchr1.basics.jsonl import read_json_object

    file = path / "config.json" if path.is_dir() else path
    return text_dims(read_json_object(file, ConfigError, "the model config"), str(file))


QWEN35_4B = read_config(SHIPPED_CONFIG)

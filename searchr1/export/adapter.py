"""A converted LoRA adapter on disk: check it against the base model and say how to load and serve
it (its model card is :mod:`searchr1.export.card`'s).

:func:`check_adapter` reads back what :mod:`searchr1.export.convert` wrote, the way PEFT will:
every tensor must name a module of the base model (under the layout's prefix) as
``<module>.lora_A.weight`` ``(rank, in)`` or ``<module>.lora_B.weight`` ``(out, rank)``, where the
rank is ``rank_pattern``'s for that module or ``r``; each A has its B; every module with tensors is
among ``target_modules``. A problem is one line naming the tensor or field.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.basics.json_types import as_int, as_list, as_object, as_str
from searchr1.export.convert import VLLM_MAX_LORA_RANKS, ExportFormat, Layout
from searchr1.export.qwen35 import Qwen35Text

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")


@dataclass
class Adapter:
    """An adapter folder as read back: its config, tensor shapes and what is wrong with it."""

    folder: Path
    config: Mapping[str, object]  # adapter_config.json as read back (convert.PeftConfig's fields)
    shapes: dict[str, tuple[int, ...]]
    problems: list[str] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return as_int(self.config.get("r") or 0, "r")

    @property
    def base_model(self) -> str:
        return str(self.config.get("base_model_name_or_path") or "")

    @property
    def target_modules(self) -> list[str]:
        modules = self.config.get("target_modules")
        if isinstance(modules, str):
            return [modules]
        return [as_str(module, "target_modules") for module in as_list(modules or [], "target_modules")]

    @property
    def max_rank(self) -> int:
        pattern = as_object(self.config.get("rank_pattern") or {}, "rank_pattern")
        return max([self.rank, *(as_int(v, "rank_pattern") for v in pattern.values())])


def find_adapter(folder: Path) -> Path | None:
    """The folder (``folder`` itself or one below it) holding both adapter files, if any."""
    for candidate in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
        if (candidate / CONFIG_FILE).is_file() and (candidate / WEIGHTS_FILE).is_file():
            return candidate
    return None


def _rank_of(module: str, config: Mapping[str, object]) -> int:
    """PEFT's rule: the ``rank_pattern`` key matching the end of the module's name, else ``r``."""
    for key, rank in as_object(config.get("rank_pattern") or {}, "rank_pattern").items():
        if re.match(rf"(.*\.)?({key})$", module):
            return as_int(rank, "rank_pattern")
    return as_int(config["r"], "r")


def check_adapter(folder: Path, dims: Qwen35Text, layout: Layout) -> Adapter:
    """Read the adapter in ``folder`` and list what would not load exactly onto ``dims``."""
    from safetensors import safe_open

    config: Mapping[str, object] = json.loads((folder / CONFIG_FILE).read_text("utf-8"))
    with safe_open(str(folder / WEIGHTS_FILE), framework="numpy") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    adapter = Adapter(folder, config, shapes)
    modules = {f"{layout.prefix}{path}" if path != "lm_head" else "base_model.model.lm_head": size
               for path, size in dims.linear_modules().items()}
    seen: dict[str, set[str]] = {}
    for name, shape in sorted(shapes.items()):
        match = PEFT_TENSOR.match(name)
        if match is None or match["module"] not in modules:
            adapter.problems.append(f"tensor {name}: no such module in the base model ({dims.source})")
            continue
        module, part = match["module"], match["part"]
        seen.setdefault(module, set()).add(part)
        leaf = module.rsplit(".", 1)[-1]
        if leaf not in adapter.target_modules:
            adapter.problems.append(f"tensor {name}: {leaf} is not among target_modules")
        fan_in, fan_out = modules[module]
        rank = _rank_of(module.removeprefix("base_model.model."), config)
        want = (rank, fan_in) if part == "A" else (fan_out, rank)
        if shape != want:
            adapter.problems.append(f"tensor {name}: shape {shape}, expected {want}")
    for module, parts in sorted(seen.items()):
        if parts != {"A", "B"}:
            adapter.problems.append(f"tensors {module}.lora_*: lora_{'B' if 'A' in parts else 'A'} is missing")
    return adapter


# --- what to print and write -----------------------------------------------------------------


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that is at least ``rank``."""
    return next(r for r in VLLM_MAX_LORA_RANKS if r >= rank)


def use_commands(folder: Path, adapter: Adapter, export_format: ExportFormat, layout: Layout, *,
                 base: str, name: str = "searchr1") -> list[str]:
    """The commands that load or serve this adapter, as they run."""
    where = shlex.quote(str(folder))
    if export_format is ExportFormat.VLLM:
        return [f"vllm serve {shlex.quote(base)} --enable-lora --max-lora-rank {vllm_max_lora_rank(adapter.max_rank)} "
                f"--lora-modules {name}={where}"]
    auto = "AutoModelForCausalLM" if layout is Layout.CAUSAL_LM else "AutoModelForImageTextToText"
    return [f"python -c \"from transformers import {auto}; from peft import PeftModel; "
            f"model = PeftModel.from_pretrained({auto}.from_pretrained({base!r}), {str(folder)!r})\""]
